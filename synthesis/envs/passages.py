"""Passages of a knowledge base: chunking, stable chunk ids and lexical retrieval.

Chunking: a passage is split into paragraphs (blank lines); a paragraph of at most
``MAX_CHUNK_CHARS`` is one chunk, a longer one is cut into windows of whole sentences that each
stay under the cap (a single longer sentence is a chunk of its own). Whitespace inside a chunk is
collapsed. Chunking is idempotent (a chunk re-chunks to itself), so a chunk's id, the content hash
of its text, survives pruning a knowledge base down to the chunks its groundings cite.

Retrieval: Okapi BM25 over ``synthesis.envs.fuzzy.tokens`` minus a few stop words, ties broken by chunk
order, so it is deterministic and needs no model. LanceDB (the tool index's store) was considered
and not used: retrieval here runs per prompt over a few hundred chunks held in one record, where
an in-memory lexical index is exact, instant and reproducible, and entity names (the keys of
prose facts) are exactly what lexical matching finds best.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from arena.hashing import content_hash
from arena.records.envs import KnowledgeBase, SubQA
from synthesis.envs.fuzzy import tokens

MAX_CHUNK_CHARS = 600
"""Largest chunk, in characters (about 150 tokens): a paragraph or a few sentences."""
BM25_K1 = 1.2
BM25_B = 0.75
STOP_WORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were what "
    "which who whom whose with".split()
)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = (
    "Mr.",
    "Mrs.",
    "Ms.",
    "Dr.",
    "St.",
    "Mt.",
    "Jr.",
    "Sr.",
    "e.g.",
    "i.e.",
    "etc.",
    "vs.",
    "No.",
)


@dataclass(frozen=True)
class Chunk:
    """One retrievable piece of a knowledge base's text."""

    id: str
    """``c-`` + content hash of the text (stable across pruning and re-chunking)."""
    passage: int
    """Index of the passage it came from."""
    text: str


def chunk_id(text: str) -> str:
    return content_hash(text, prefix="c-", length=12)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after . ! ? before a capital or digit; common abbreviations kept)."""
    flat = " ".join(text.split())
    if not flat:
        return []
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(flat):
        head = flat[start : m.start()]
        if head.endswith(_ABBREVIATIONS) or re.search(r"\b[A-Z]\.$", head):
            continue  # 'Dr. Smith', 'J. Smith': not a sentence end
        out.append(flat[start : m.start()].strip())
        start = m.end()
    out.append(flat[start:].strip())
    return [s for s in out if s]


def chunk_text(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """The chunks of one passage (see the module doc)."""
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        if not flat:
            continue
        if len(flat) <= max_chars:
            out.append(flat)
            continue
        window: list[str] = []
        for sentence in split_sentences(flat):
            if window and len(" ".join([*window, sentence])) > max_chars:
                out.append(" ".join(window))
                window = []
            window.append(sentence)
        if window:
            out.append(" ".join(window))
    return out


def chunk_passages(passages: Sequence[str], max_chars: int = MAX_CHUNK_CHARS) -> list[Chunk]:
    """Every chunk of ``passages``, in order; a chunk repeated verbatim is kept once."""
    seen: set[str] = set()
    out: list[Chunk] = []
    for n, passage in enumerate(passages):
        for text in chunk_text(passage, max_chars):
            cid = chunk_id(text)
            if cid not in seen:
                seen.add(cid)
                out.append(Chunk(cid, n, text))
    return out


def index_terms(text: str) -> list[str]:
    """Retrieval terms: folded tokens without stop words."""
    return [t for t in tokens(text) if t not in STOP_WORDS]


class Bm25:
    """Okapi BM25 over a fixed list of texts."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.docs = [Counter(index_terms(t)) for t in texts]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg = (sum(self.lengths) / len(self.docs)) if self.docs else 0.0
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = set(index_terms(query))
        out = []
        for doc, length in zip(self.docs, self.lengths, strict=True):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / (self.avg or 1.0))
            out.append(sum(self.idf[t] * doc[t] * (BM25_K1 + 1) / (doc[t] + norm) for t in terms if t in doc))
        return out

    def ranking(self, query: str) -> list[int]:
        """Every text's index, best first (ties and zero scores in input order)."""
        scores = self.scores(query)
        return sorted(range(len(scores)), key=lambda i: (-scores[i], i))

    def top(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best texts with a positive score."""
        scores = self.scores(query)
        return [i for i in self.ranking(query) if scores[i] > 0][:k]


def prune_knowledge(kb: KnowledgeBase, sub_qas: Sequence[SubQA], extra_chunks: int = 0) -> KnowledgeBase:
    """Only the tables the groundings refer to (and links among them), and the passage chunks they cite.

    ``extra_chunks`` more chunks (the first ones not cited, in order) may be kept as distractors so a
    passage search tool has more than the answer to search through.
    """
    groundings = [s.grounding for s in sub_qas if s.grounding is not None]
    used = {g.table for g in groundings if not g.is_passage}
    tables = [
        t.model_copy(update={"links": {c: v for c, v in t.links.items() if v in used}})
        for t in kb.tables
        if t.name in used
    ]
    cited = {g.passage for g in groundings if g.is_passage}
    passages: list[str] = []
    if cited:
        chunks = chunk_passages(kb.passages)
        extra = {c.id for c in chunks if c.id not in cited}
        keep = cited | set(sorted(extra, key=[c.id for c in chunks].index)[:extra_chunks])
        passages = [c.text for c in chunks if c.id in keep]  # in the knowledge base's order
    return KnowledgeBase(domain=kb.domain, tables=tables, passages=passages)
