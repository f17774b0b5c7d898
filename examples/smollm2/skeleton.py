"""A prompt's skeleton: its wording with the numbers, names and quoted strings masked. Two prompts whose
skeletons are equal are template twins ("Jessi has 58 marbles..." and "Rod has 7 marbles..."): a drafter
trained on one has, in effect, seen the other, so an evaluation prompt with a twin among the training prompts
measures memorised wording rather than general chat (issue 56 §2).

The rule, on the text's tokens, in order:
- a quoted string is one `<quote>`: text between "...", “...”, ‘...’, `...`, or '...' where neither quote
  touches a letter (so "don't" and "King's" are not quotes);
- a number is `<num>`: a run of digits, with inner `.` or `,` groups ("1,000", "3.5"); "37th" is `<num> th`;
- a name is `<name>`: a word that begins with a capital letter (proper names, and acronyms such as "NASA"),
  unless its lower-case form is one of COMMON, the words that are capitalised only because they open a
  sentence or a title (question words, pronouns, articles, auxiliaries, prepositions, conjunctions, and the
  verbs requests open with: "What", "The", "Explain"); names next to each other are one `<name>`
  ("San Juan Capistrano"), so a slot filled with one word or with three reads the same;
- every other word is lower-cased; punctuation stays, one token per mark, except the marks that end the
  text ("?", ".", "!"), which are dropped;
- tokens are joined by single spaces (so whitespace and line breaks do not count).

What it does not mask: numbers written in words ("seven"), and names written in lower case ("xiaomi redmi
note 4" keeps "xiaomi redmi note"). A name spelled like a COMMON word ("Will", "May") is read as that word.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

QUOTE, NUMBER, NAME = "<quote>", "<num>", "<name>"
_COMMON_WORDS = """
    a an the this that these those there here it its i me my mine you your yours he him his she her hers we
    us our ours they them their theirs someone somebody something everyone everybody everything anyone
    anybody anything nobody nothing one each every all some any no none both either neither other another
    such what who whom whose which when where why how whether whatever whoever whichever
    is are was were be been being am do does did done can could will would shall should may might must
    have has had having not
    and or but nor yet so if then than because although though while unless until since once as also
    however therefore instead
    in on at by for from to of with without about above below after before during into onto over under
    between among through across against along around behind beyond near off out up down upon within like
    per via
    please hi hello hey yes no ok okay thanks thank good now today tomorrow yesterday just only even still
    very much many more most less least few first second next last finally
    write rewrite explain describe give tell list name make create compose draft plan suggest translate
    complete summarize summarise imagine pretend discuss compare provide share help consider suppose
    identify extract evaluate analyze analyse implement develop find read edit craft act embody picture
    embrace show let use define calculate solve prove design build add check choose determine estimate
    outline recommend review state take think try answer ask assume convert count draw fill generate given
    improve keep look note offer put return run say see set start turn work play get go know want need
    don't doesn't didn't isn't aren't wasn't weren't can't couldn't won't wouldn't shouldn't haven't hasn't
    i'm i've i'd i'll it's that's there's here's what's who's how's where's let's you're we're they're
"""
COMMON = frozenset(_COMMON_WORDS.split())
_TOKEN = re.compile(
    r"""
    (?P<quote>"[^"\n]*"|“[^”\n]*”|‘[^’\n]*’|`[^`\n]+`|(?<![^\W\d_])'[^'\n]+'(?![^\W\d_]))
    | (?P<number>\d+(?:[.,]\d+)*)
    | (?P<word>[^\W\d_]+(?:['’-][^\W\d_]+)*)
    | (?P<mark>\S)
    """,
    re.VERBOSE,
)
_ENDING = frozenset("?.!")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    previous_end = 0
    for match in _TOKEN.finditer(text):
        kind, value = match.lastgroup, match.group()
        if kind == "quote":
            out.append(QUOTE)
        elif kind == "number":
            out.append(NUMBER)
        elif kind == "word" and value[0].isupper() and value.lower().replace("’", "'") not in COMMON:
            joined = out and out[-1] == NAME and text[previous_end : match.start()].isspace()
            if not joined:  # a name right after a name, across spaces, is one name ("San Juan Capistrano")
                out.append(NAME)
        elif kind == "word":
            out.append(value.lower())
        else:
            out.append(value)
        previous_end = match.end()
    while out and out[-1] in _ENDING:
        out.pop()
    return out


def skeleton(text: str) -> str:
    """The text's skeleton (module docstring): equal skeletons make two prompts template twins."""
    return " ".join(_tokens(text))


class Skeletons:
    """The skeletons of a set of texts (the training prompts): `twin(text)` says whether another text has the
    skeleton of one of them."""

    def __init__(self, texts: Iterable[str]) -> None:
        self._skeletons = frozenset(skeleton(text) for text in texts)

    def __len__(self) -> int:
        return len(self._skeletons)

    def twin(self, text: str) -> bool:
        return skeleton(text) in self._skeletons
