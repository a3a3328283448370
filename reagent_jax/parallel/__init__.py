"""Meshes and the logical-axis rules table."""
from reagent_jax.parallel.mesh import (MESH_PRESETS, make_mesh, maybe_initialize_distributed, mesh_from_preset,
                                       mesh_platform, preset_fits)
from reagent_jax.parallel.rules import (DEFAULT_RULES, check_mesh_axes, constrain, logical_to_spec, named_sharding,
                                        tree_shardings)
