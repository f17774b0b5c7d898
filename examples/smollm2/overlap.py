"""What "the same prompt" and "nearly the same prompt" mean for the SmolLM2 example's prompt sets.

- Same: equal normalised text (lower case, whitespace collapsed).
- Nearly the same: two texts share at least half of the shorter one's content n-grams: its word n-grams
  (NGRAM words, after normalising; punctuation stays part of a word) less the boilerplate ones, those that
  lie wholly inside the fixed wording of a request template ("Translate this ... sentence into English")
  or occur in BOILERPLATE_EVAL or more evaluation prompts. A text with no content n-grams (shorter than
  NGRAM words, or all template) is only ever "the same", never "nearly the same". One changed word breaks at
  most NGRAM n-grams, so a question with a word or two swapped is still caught, while two requests built
  from one template around different topics share only template n-grams, which do not count (the tests
  check both).

Used to keep every training prompt apart from every evaluation prompt (HumanEval and the chat set).
Standard library only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

NGRAM = 6
SHARE = 0.5  # of the shorter text's content n-grams
BOILERPLATE_EVAL = 3  # an n-gram in this many evaluation prompts is wording, not content
_SLOT = re.compile(r"\{[^{}]*\}")
_BREAK = "\x00"  # stands for a template's slot: no real text has it, so no n-gram spans it


def normalised(text: str) -> str:
    """Lower case, whitespace collapsed: what "the same text" means for deduplication."""
    return " ".join(text.lower().split())


def ngrams(text: str, n: int = NGRAM) -> frozenset[tuple[str, ...]]:
    """The distinct word n-grams of the normalised text (empty when it has fewer than n words)."""
    words = normalised(text).split()
    return frozenset(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def template_ngrams(templates: Iterable[str]) -> frozenset[tuple[str, ...]]:
    """The n-grams wholly inside the fixed wording of `str.format` templates (none spans a `{slot}`)."""
    found: set[tuple[str, ...]] = set()
    for template in templates:
        found |= ngrams(_SLOT.sub(f" {_BREAK} ", template))
    return frozenset(g for g in found if _BREAK not in g)


class NearDuplicates:
    """An index of texts (the evaluation prompts) that says whether another text is the same as, or nearly
    the same as, one of them; `templates` are the request templates whose wording is boilerplate."""

    def __init__(self, texts: Iterable[str], templates: Iterable[str] = ()) -> None:
        texts = list(texts)
        self._texts: dict[str, list[int]] = {}
        for index, text in enumerate(texts):
            self._texts.setdefault(normalised(text), []).append(index)
        every = [ngrams(text) for text in texts]
        frequent = Counter(g for grams in every for g in grams)
        self._boilerplate = template_ngrams(templates) | {
            g for g, n in frequent.items() if n >= BOILERPLATE_EVAL
        }
        self._sizes: list[int] = []
        self._by_gram: dict[tuple[str, ...], list[int]] = {}
        for index, grams in enumerate(every):
            content = grams - self._boilerplate
            self._sizes.append(len(content))
            for gram in content:
                self._by_gram.setdefault(gram, []).append(index)

    def matches(self, text: str) -> bool:
        return bool(self.matching(text))

    def matching(self, text: str, share_of_indexed: bool = False) -> list[int]:
        """The indices (in the order given) of the texts that `text` is the same as or nearly the same as.
        `share_of_indexed`: the shared n-grams must be half of the indexed text's own, not of the shorter
        text's (a three-word question inside a long prompt does not make the prompt near it)."""
        same = self._texts.get(normalised(text), [])
        grams = ngrams(text) - self._boilerplate
        if not grams:
            return list(same)
        shared: Counter[int] = Counter()
        for gram in grams:
            shared.update(self._by_gram.get(gram, ()))
        near = [
            i
            for i, count in shared.items()
            if count >= SHARE * (self._sizes[i] if share_of_indexed else min(len(grams), self._sizes[i]))
        ]
        return sorted({*same, *near})
