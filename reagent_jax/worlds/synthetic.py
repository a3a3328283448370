"""A generated world of fictional entities for the CPU quickstart.

Why: the quickstart trains a tiny model on two CPU cores in minutes, so the task must need real
tool use (search, then python) while the language stays small and repetitive. Every entity is a
made-up name (a few syllables) with a handful of small integer attributes, described by one fixed
sentence pattern ("The population of Varel is 452."). Questions ask for one attribute (level 1),
two attributes combined with plus / minus / times (level 2), or three combined with plus / minus
(level 3). Everything is a pure function of `WorldConfig`, so a seed reproduces the whole world.

    world = make_world(WorldConfig(seed=0, n_entities=60, n_questions=300))
    world.corpus()            # [{"id", "title", "contents"}], the search corpus
    world.write_corpus_jsonl(path)
    world.train, world.heldout  # disjoint tuples of `Question` (held-out may reuse entities)
    world.search("population of Varel", topk=2)   # the local lexical retriever
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import re
from typing import Any, Mapping, Sequence

DATA_SOURCE = "synthetic"

# Each kind has three attributes (name, low, high); values are drawn uniformly in [low, high].
KINDS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "town": (("population", 100, 999), ("area", 10, 99), ("founding year", 1100, 1999)),
    "person": (("age", 18, 90), ("height", 150, 199), ("weight", 45, 99)),
    "company": (("staff", 10, 999), ("founding year", 1100, 1999), ("shops", 2, 60)),
}
# `times` is only used on attributes this small, so products stay at most four digits.
SMALL_ATTRIBUTE_MAX = 99
OPS: dict[str, str] = {"plus": "+", "minus": "-", "times": "*"}

DEFAULT_SYLLABLES = (
    "ka", "lo", "mi", "ven", "dor", "sa", "tu", "rel", "bo", "ni", "quo", "zen", "fa", "lu", "ter",
    "mo",
)


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Sizes and seed of a synthetic world (all fields are plain values, ml_collections friendly)."""

    seed: int = 0
    n_entities: int = 60
    n_questions: int = 300
    heldout_fraction: float = 0.2
    level_weights: tuple[float, float, float] = (0.3, 0.5, 0.2)  # levels 1, 2, 3
    search_topk: int = 2  # documents per search call in expert trajectories
    syllables: tuple[str, ...] = DEFAULT_SYLLABLES
    # The words level-2/3 questions combine terms with (a subset of OPS). A model too small to read
    # the operator from the question can still learn a world with one (the CPU quickstart).
    operators: tuple[str, ...] = tuple(OPS)

    def validate(self) -> None:
        if self.n_entities < 3:
            raise ValueError(f"WorldConfig.n_entities must be >= 3 (level-3 questions need three), got {self.n_entities}")
        if self.n_questions < 2:
            raise ValueError(f"WorldConfig.n_questions must be >= 2 (one train, one held-out), got {self.n_questions}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"WorldConfig.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if len(self.level_weights) != 3 or min(self.level_weights) < 0 or sum(self.level_weights) <= 0:
            raise ValueError(f"WorldConfig.level_weights must be three non-negative weights, got {self.level_weights}")
        if self.search_topk < 1:
            raise ValueError(f"WorldConfig.search_topk must be >= 1, got {self.search_topk}")
        ops = tuple(self.operators)
        if not ops or len(set(ops)) != len(ops) or not set(ops) <= set(OPS):
            raise ValueError(f"WorldConfig.operators must be distinct words from {tuple(OPS)}, got {self.operators}")
        if self.level_weights[2] > 0 and not {"plus", "minus"} & set(ops):
            raise ValueError("WorldConfig: level-3 questions (level_weights[2] > 0) combine with plus / minus; "
                             f"operators={ops} has neither")
        if len(set(self.syllables)) < 4 or not all(re.fullmatch(r"[a-z]+", s) for s in self.syllables):
            raise ValueError(f"WorldConfig.syllables must hold >= 4 distinct lowercase syllables, got {self.syllables}")


@dataclasses.dataclass(frozen=True)
class Entity:
    name: str
    kind: str
    attributes: tuple[tuple[str, int], ...]  # in the order of KINDS[kind]

    def value(self, attribute: str) -> int:
        for name, value in self.attributes:
            if name == attribute:
                return value
        raise KeyError(f"{self.kind} {self.name!r} has no attribute {attribute!r}")

    def document(self, doc_id: str) -> dict[str, str]:
        sentences = [f"{self.name} is a {self.kind}."]
        sentences += [fact_sentence(self.name, a, v) for a, v in self.attributes]
        return {"id": doc_id, "title": self.name, "contents": " ".join(sentences)}


@dataclasses.dataclass(frozen=True)
class Term:
    """One lookup a question needs: the `attribute` of entity `entity` (true value `value`)."""

    entity: str
    attribute: str
    value: int

    @property
    def phrase(self) -> str:
        return f"the {self.attribute} of {self.entity}"

    @property
    def query(self) -> str:
        return f"{self.attribute} of {self.entity}"


@dataclasses.dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    level: int
    terms: tuple[Term, ...]
    ops: tuple[str, ...]  # len(terms) - 1 words from OPS, applied left to right
    split: str  # "train" or "heldout"

    def expression(self, values: Sequence[int] | None = None) -> str:
        """Python expression for the answer, e.g. "452 + 1310" (left-to-right equals precedence here)."""
        return expression([t.value for t in self.terms] if values is None else values, self.ops)

    def to_record(self) -> dict[str, Any]:
        """The JSONL row used by data pipelines and `rewards.score_answer` (benchmark-like schema)."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": [self.answer],
            "source": DATA_SOURCE,
            "data_source": DATA_SOURCE,
            "meta": {
                "level": self.level,
                "split": self.split,
                "ops": list(self.ops),
                "terms": [dataclasses.asdict(t) for t in self.terms],
            },
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Question":
        try:
            meta = record["meta"]
            answer = record["answer"]
            return cls(
                id=str(record["id"]),
                question=str(record["question"]),
                answer=str(answer[0] if isinstance(answer, (list, tuple)) else answer),
                level=int(meta["level"]),
                terms=tuple(Term(str(t["entity"]), str(t["attribute"]), int(t["value"])) for t in meta["terms"]),
                ops=tuple(str(o) for o in meta["ops"]),
                split=str(meta.get("split", "train")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"not a synthetic-world question record ({type(e).__name__}: {e}): {dict(record)!r:.300}") from e


def fact_sentence(name: str, attribute: str, value: int) -> str:
    return f"The {attribute} of {name} is {value}."


def expression(values: Sequence[int], ops: Sequence[str], words: bool = False) -> str:
    """"452 + 1310" (or "452 plus 1310" with words=True); ops are applied left to right."""
    if len(values) != len(ops) + 1:
        raise ValueError(f"need len(values) == len(ops) + 1, got {len(values)} values and {len(ops)} ops")
    parts = [str(values[0])]
    for op, v in zip(ops, values[1:]):
        parts += [op if words else OPS[op], str(v)]
    return " ".join(parts)


def apply_ops(values: Sequence[int], ops: Sequence[str]) -> int:
    """Left-to-right evaluation; `times` only appears in two-term questions, so this equals Python."""
    if len(values) != len(ops) + 1:
        raise ValueError(f"need len(values) == len(ops) + 1, got {len(values)} values and {len(ops)} ops")
    result = int(values[0])
    for op, v in zip(ops, values[1:]):
        if op == "plus":
            result += v
        elif op == "minus":
            result -= v
        elif op == "times":
            result *= v
        else:
            raise ValueError(f"unknown operation {op!r}; expected one of {sorted(OPS)}")
    return result


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@dataclasses.dataclass(frozen=True)
class SyntheticWorld:
    config: WorldConfig
    entities: tuple[Entity, ...]
    questions: tuple[Question, ...]  # train questions first, then held-out

    @property
    def train(self) -> tuple[Question, ...]:
        return tuple(q for q in self.questions if q.split == "train")

    @property
    def heldout(self) -> tuple[Question, ...]:
        return tuple(q for q in self.questions if q.split == "heldout")

    def entity(self, name: str) -> Entity:
        for e in self.entities:
            if e.name.lower() == name.lower():
                return e
        raise KeyError(f"no entity named {name!r} in this world")

    def question(self, question_id: str) -> Question:
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(f"no question with id {question_id!r} in this world")

    def corpus(self) -> list[dict[str, str]]:
        return [dict(d) for d in self._docs]

    @functools.cached_property
    def _docs(self) -> tuple[dict[str, str], ...]:
        return tuple(e.document(f"syn-{i:04d}") for i, e in enumerate(self.entities))

    @functools.cached_property
    def _index(self) -> tuple[tuple[frozenset[str], ...], dict[str, float]]:
        doc_tokens = tuple(frozenset(_tokens(d["contents"])) for d in self._docs)
        n = len(doc_tokens)
        df: dict[str, int] = {}
        for toks in doc_tokens:
            for t in toks:
                df[t] = df.get(t, 0) + 1
        idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        return doc_tokens, idf

    def write_corpus_jsonl(self, path: str | os.PathLike) -> str:
        """One {"id","title","contents"} object per line, the format the retrieval server indexes."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"  # atomic: hosts sharing the workdir never read half a file
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in self.corpus():
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        return path

    def records(self, split: str = "train") -> list[dict[str, Any]]:
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
        return [q.to_record() for q in self.questions if split == "all" or q.split == split]

    def search(self, query: str, topk: int | None = None) -> list[dict[str, str]]:
        """Deterministic lexical retrieval (sum of idf over matched query words; ties by corpus order).

        Names are unique words, so the entity named in the query always ranks first; the real
        BM25 tool agrees on that, which is all the expert trajectories rely on.
        """
        topk = self.config.search_topk if topk is None else int(topk)
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        doc_tokens, idf = self._index
        words = set(_tokens(query))
        scores = sorted((-sum(idf[w] for w in words if w in toks), i) for i, toks in enumerate(doc_tokens))
        return [dict(self._docs[i]) for s, i in scores[:topk] if s < 0]


def _entity_names(rng: random.Random, syllables: Sequence[str], n: int) -> list[str]:
    two = [a + b for a in syllables for b in syllables if a != b]
    pool = sorted(set(two))
    if n > len(pool) // 2:  # leave room: add three-syllable names only when the world is big
        pool += sorted({a + b + c for a in syllables for b in syllables for c in syllables if len({a, b, c}) == 3})
    if n > len(pool):
        raise ValueError(f"cannot make {n} distinct names from {len(syllables)} syllables")
    rng.shuffle(pool)
    return [name.capitalize() for name in pool[:n]]


def _make_entities(rng: random.Random, config: WorldConfig) -> tuple[Entity, ...]:
    kinds = sorted(KINDS)
    entities = []
    for i, name in enumerate(_entity_names(rng, config.syllables, config.n_entities)):
        kind = kinds[i % len(kinds)]  # balanced kinds, so every question shape is possible
        attrs = tuple((a, rng.randint(lo, hi)) for a, lo, hi in KINDS[kind])
        entities.append(Entity(name, kind, attrs))
    return tuple(entities)


def _small(attribute: str) -> bool:
    return all(hi <= SMALL_ATTRIBUTE_MAX for attrs in KINDS.values() for a, lo, hi in attrs if a == attribute)


def _make_question(rng: random.Random, entities: Sequence[Entity], level: int,
                   operators: Sequence[str] = tuple(OPS)) -> tuple[str, tuple[Term, ...], tuple[str, ...]] | None:
    """(text, terms, ops), or None when no allowed operator fits the drawn terms (times-only and
    large attributes); the caller draws again."""
    chosen = rng.sample(list(entities), level)
    terms = []
    for e in chosen:
        attribute, value = rng.choice(e.attributes)
        terms.append(Term(e.name, attribute, value))
    if level == 1:
        ops: tuple[str, ...] = ()
    elif level == 2:
        choices = [o for o in ("plus", "minus") if o in operators]
        if "times" in operators and all(_small(t.attribute) for t in terms):
            choices.append("times")
        if not choices:
            return None
        ops = (rng.choice(choices),)
        if ops[0] == "minus" and terms[0].value < terms[1].value:
            terms.reverse()  # keep level-2 differences non-negative
    else:
        ops = tuple(rng.choice([o for o in ("plus", "minus") if o in operators]) for _ in range(level - 1))
    words = [terms[0].phrase]
    for op, t in zip(ops, terms[1:]):
        words += [op, t.phrase]
    return f"What is {' '.join(words)}?", tuple(terms), ops


def make_world(config: WorldConfig | None = None, **overrides: Any) -> SyntheticWorld:
    """Build the whole world from `config` (fields may be overridden by keyword)."""
    config = dataclasses.replace(config or WorldConfig(), **overrides)
    config.validate()
    rng = random.Random(config.seed)
    entities = _make_entities(rng, config)
    seen: set[str] = set()
    drafts = []
    attempts = 0
    while len(drafts) < config.n_questions:
        attempts += 1
        if attempts > 50 * config.n_questions + 1000:
            raise ValueError(
                f"could only make {len(drafts)} distinct questions from {config.n_entities} entities; "
                f"lower n_questions ({config.n_questions}) or raise n_entities"
            )
        level = rng.choices((1, 2, 3), weights=config.level_weights)[0]
        drawn = _make_question(rng, entities, level, config.operators)
        if drawn is None:
            continue
        text, terms, ops = drawn
        if text in seen:
            continue
        seen.add(text)
        drafts.append((text, terms, ops, level))
    rng.shuffle(drafts)
    n_heldout = max(1, min(len(drafts) - 1, round(config.heldout_fraction * len(drafts))))
    questions = []
    for i, (text, terms, ops, level) in enumerate(drafts):
        split = "train" if i < len(drafts) - n_heldout else "heldout"
        answer = str(apply_ops([t.value for t in terms], ops))
        questions.append(Question(f"synthetic/{config.seed}/{i}", text, answer, level, terms, ops, split))
    return SyntheticWorld(config, entities, tuple(questions))
