"""hosts: the job split over processes, device grouping, and the single-process gather."""
import types

import pytest

from reagent_jax.parallel import hosts


@pytest.mark.parametrize("n,count", [(0, 2), (1, 2), (4, 2), (7, 3), (5, 8)])
def test_shares_are_contiguous_disjoint_and_cover_the_jobs_in_order(n, count):
    shares = [hosts.share(n, p, count) for p in range(count)]
    assert [j for s in shares for j in s] == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_allgather_objects_on_one_process_is_the_object_itself():
    obj = {"a": [1, 2]}
    assert hosts.allgather_objects(obj) == [obj]


def _dev(i, p):
    return types.SimpleNamespace(id=i, process_index=p)


def test_process_groups_keep_each_process_devices_in_mesh_order():
    devs = [_dev(0, 1), _dev(1, 0), _dev(2, 1), _dev(3, 0)]
    groups = hosts.process_groups(devs)
    assert [[d.id for d in row] for row in groups] == [[1, 3], [0, 2]]
    with pytest.raises(ValueError, match="different numbers of devices per process"):
        hosts.process_groups(devs[:3])
