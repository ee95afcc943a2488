"""Can the English-only parts of the verifier judge this text? (cache.verify fails closed if not.)

Deliberately one-sided: text is "English" unless it shows signs of another language (letters
outside ASCII, or more function words of another Latin-script language than of English). Short
English fragments ("Open savings account") have no English function words and must still pass.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_ENGLISH = frozenset(
    "the a an is are do does did how what why when where who which can could should will would i my "
    "me you your to of in on for with and or not it this that there be have has was from at by".split()
)
# Frequent function words of other Latin-script languages, minus those common in English too
# ("die", "no", "per", "pour", "con"): two of them, and more than English ones, mark a foreign text.
_FOREIGN = frozenset(
    """
    der das und ist nicht ich wie mein meine kann ein eine mit von zu auf für wo warum wann was
    le la les et est pas je comment mon ma mes peut un une avec où pourquoi quand que qui des du de au
    aux sur dans
    el los las y es yo cómo como mi mis puedo una con por para dónde donde qué que cuándo del
    il lo gli è non io mio mia posso dove perché quando che di
    o os as e é não eu meu minha posso com por para onde quando
    het een en is niet ik hoe mijn kan met van voor waar waarom wanneer wat
    och är inte jag hur min kan med för var varför när vad att
    ve bir ne nasıl neden nerede
    """.split()
)


def is_english(text: str) -> bool:
    """Whether the scorer can judge this text (False: only exact repeats may be served)."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False
    non_ascii = sum(1 for c in letters if not c.isascii())
    # A name or a borrowed word ("café", "Zürich") is fine; a sentence in another script is not.
    if non_ascii > 3 or non_ascii / len(letters) > 0.1:
        return False
    words = [w.lower() for w in _WORD.findall(text)]
    foreign = sum(1 for w in words if w in _FOREIGN and w not in _ENGLISH)
    english = sum(1 for w in words if w in _ENGLISH)
    return not (foreign >= 2 and foreign > english)
