"""The verification step: may the answer cached for `candidate` be served for `query`?

Two modes (VerifierSettings.mode). "scorer", the default: the rules below become features of a
learned pair scorer (cache.pairfeatures, cache.scorer), which decides at the threshold the error
budget (CacheSettings.max_wrong_rate) picks from its calibration curve; `hard_rules` still veto on
their own, and text that is not English fails closed (cache.language). "rules": the rules alone,
as described here.

Embedding cosine alone serves wrong answers on look-alike prompts ("cancel" vs "don't cancel",
"Paris to Rome" vs "Rome to Paris", "3 tablets" vs "30 tablets", "all users" vs "admin users",
"increase" vs "decrease", "how" vs "why"). So after a similarity floor, cheap, explainable rules run on
both texts, in this order (the first one that decides names itself in the Verdict):

  exact         identical after normalization (case, punctuation, whitespace, contractions) -> accept
  below_floor   cosine under `min_similarity` -> reject
  negation      different count of negations (not/no/never/without/n't/unable/-free...) -> veto
  number        numbers (digits, number words, ordinals, "dozen") or their units differ -> veto
  date          weekdays, months, years-as-words, today/tomorrow, next/last week, seasons differ -> veto
  question      incompatible question types (why vs how vs when vs where vs who vs how-much, or
                yes/no vs a specific wh-question) -> veto
  antonym       a word on one side and its opposite on the other (lexicon + un-/dis-/in-/de- prefixes,
                in/ex, up/down, over/under swaps) -> veto
  direction     two shared words swap around a shared pivot (from X to Y, X owes Y, X than Y) or a word
                changes role (from -> to) -> veto
  content       remaining content words (stopwords and request framing removed, light stemming, a
                synonym list, typo and split-word matching) that have no counterpart on the other side:
                  none           accept if cosine >= accept_clean
                  one side only  (narrower/wider scope) accept if few, none a proper noun or code,
                                 and cosine >= accept_added
                  both sides     (a substituted word) accept only if cosine >= accept_substituted

Everything is pure Python on short strings; per-text analysis is memoized, so a check costs tens of
microseconds. Rules can be switched off one by one (`disabled_rules`) for ablations.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from cache.interfaces import Verdict
from cache.language import is_english
from semserve.config import Settings, setting
from semserve.logs import get_logger

if TYPE_CHECKING:
    from cache.scorer import PairScorer

log = get_logger("semserve.cache.verify")

RULES = ("negation", "number", "date", "question", "antonym", "direction", "content")


@dataclass
class VerifierSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_VERIFY_"

    min_similarity: float = setting(0.70, "Cosine below which a candidate is rejected outright.")
    accept_clean: float = setting(
        0.80, "Cosine needed when every content word has a counterpart (reorder, synonyms, typos)."
    )
    accept_added: float = setting(
        0.92, "Cosine needed when one side has extra content words (narrower/wider scope risk)."
    )
    max_added: int = setting(2, "Most extra content words on one side that can still be accepted.")
    accept_substituted: float = setting(
        0.93, "Cosine needed when both sides have content words without a counterpart."
    )
    max_substituted: int = setting(1, "Most unmatched content words per side that can still be accepted.")
    disabled_rules: str = setting("", f"Comma-separated rules to skip, for ablations: {', '.join(RULES)}.")
    mode: str = setting(
        "scorer",
        "scorer: the learned pair scorer decides (calibrated by --cache-max-wrong-rate), with the rules "
        "as its features and `hard_rules` as vetoes; rules: the rules and cosine thresholds alone.",
    )
    hard_rules: str = setting(
        "number",
        "In scorer mode, rules that reject on their own whatever the score (comma-separated, of: "
        f"{', '.join(RULES[:-1])}); the others only inform the score.",
    )
    scorer_path: Path | None = setting(
        None, "Scorer file from `semserve cache train`; empty: the one shipped in cache/data/scorer.json."
    )


def _mapping(spec: str, sep: str) -> dict[str, str]:
    """'key=value key2=value2' (underscores in values are spaces) -> dict; keeps lexicons compact."""
    out = {}
    for item in spec.split():
        k, v = item.split(sep, 1)
        out[k] = v.replace("_", " ")
    return out


def _pairs(spec: str, sep: str) -> list[tuple[str, str]]:
    out = []
    for item in spec.split():
        a, b = item.split(sep, 1)
        out.append((a, b))
    return out


# ---------------------------------------------------------------------------------------------
# Lexicons. General English, not tuned to any one evaluation pair; kept small and explainable.

_CONTRACTIONS = _mapping(
    """
    can't=can_not cant=can_not cannot=can_not won't=will_not shan't=shall_not ain't=is_not
    dont=do_not doesnt=does_not didnt=did_not isnt=is_not arent=are_not wasnt=was_not
    werent=were_not havent=have_not hasnt=has_not hadnt=had_not wouldnt=would_not
    shouldnt=should_not couldnt=could_not mustnt=must_not wont=will_not whats=what_is hows=how_is
    wheres=where_is whos=who_is thats=that_is im=i_am ive=i_have youre=you_are theyre=they_are
    lets=let_us
    """,
    "=",
)
_SUFFIX_CONTRACTIONS = (
    ("n't", " not"),
    ("'re", " are"),
    ("'ve", " have"),
    ("'ll", " will"),
    ("'m", " am"),
    ("'d", " would"),
    ("'s", ""),
)

# Phrasal verbs and fixed phrases that have a one-word equivalent; applied before tokenizing.
_PHRASES = [
    (r"\bturn(?:s|ed|ing)? on\b", "enable"),
    (r"\bswitch(?:es|ed|ing)? on\b", "enable"),
    (r"\bturn(?:s|ed|ing)? off\b", "disable"),
    (r"\bswitch(?:es|ed|ing)? off\b", "disable"),
    (r"\bspeed(?:s|ing)? up\b", "accelerate"),
    (r"\bslow(?:s|ing)? down\b", "decelerate"),
    (r"\bget(?:ting)? rid of\b", "remove"),
    (r"\bset(?:ting)? up\b", "setup"),
    (r"\blog(?:ging)? (?:in|into|on)\b", "login"),
    (r"\bsign(?:ing)? (?:in|into|on)\b", "login"),
    (r"\bsign(?:ing)? up\b", "signup"),
    (r"\blog(?:ging)? out\b", "logout"),
    (r"\bsign(?:ing)? out\b", "logout"),
    (r"\bback(?:ing)? up\b", "backup"),
    (r"\bfind out\b", "find"),
    (r"\blook(?:ing)? up\b", "find"),
    (r"\bfigure out\b", "find"),
    (r"\bturn(?:s|ed|ing)? down\b", "decline"),
    (r"\bget(?:ting)? ready\b", "prepare"),
    # "I can't remember my PIN" is "I forgot my PIN": neither negates the question (forgetting is
    # why people ask how to reset it), so both become "forgot", which is no negation.
    (r"\b(?:can not|do not|does not|did not|could not) (?:remember|recall)\b", "forgot"),
    (r"\bhow come\b", "why"),
    (r"\bin order to\b", "to"),
    (r"\ba lot of\b", "many"),
    (r"\blots of\b", "many"),
    (r"\bplenty of\b", "many"),
    (r"\bmake sure\b", "ensure"),
    (r"\binstead of\b", "instead"),
    (r"\bas well as\b", "and"),
    (r"\bversus\b", "vs"),
    (r"\bcompared (?:to|with)\b", "vs"),
    (r"\bmost recent\b", "last"),
    (r"\bthe latest\b", "the latest"),
    (r"\bpick(?:ing)? up\b", "collect"),
    (r"\bcatch(?:ing)? up\b", "catchup"),
]

_STOPWORDS = frozenset(
    """
a an the this that these those it its it's i me my mine we us our ours you your yours he him his she
her hers they them their theirs one's myself yourself itself themselves
is am are was were be been being do does did doing done have has had having
can could would should shall will may might must
to of in on at by for with from into onto about as than then so if or and but nor vs v
up out over under again further once here there also too very just really actually basically
what why how when where who whom whose which
there's let s t d ll re ve m o y
some any please pls thanks kindly hi hello hey ok okay plus much many between
""".split()
)

# Words that frame a request rather than name its content: ignored when looking for unmatched words.
_FRAMING = frozenset(
    """
tell explain describe share help know want need like wondering wonder looking trying try let
way ways best good method methods steps step process guide tips tip advice idea ideas thing things
simple simply easy easily quick quickly possible properly correctly right proper exactly
someone somebody something anyone anybody anything question questions info information
recommend suggest give show provide write make do get use doing using
meaning mean means definition example examples recipe instructions tutorial happen happening
""".split()
)

# Synonym groups: words in one group count as the same word (matched after stemming).
_SYNONYM_GROUPS = [
    g.split()
    for g in """
    buy purchase | cheap inexpensive affordable budget lowcost | big large huge | small little tiny
    | fast quick rapid speedy speed | fastest quickest | faster quicker | fix repair solve resolve
    troubleshoot | change update modify edit alter switch | delete remove erase | create build
    generate produce make | show display | view see | find locate search | start begin launch
    commence | stop halt quit exit | receive get obtain | assist help support | error issue problem
    bug fault glitch | car vehicle automobile | doctor physician gp | movie film | phone smartphone
    mobile cellphone cell | laptop notebook | picture photo image pic | store shop | trip journey
    vacation holiday | use utilize employ | reboot restart | correct right proper | tip advice
    suggestion | recommend suggest | cost price fee | happen occur | learn study | dict dictionary |
    app application | website site webpage | email mail | wifi wireless | tv television | usa us
    america | uk britain | kid child children | tall high height | tallest highest | deep depth |
    long length | wide width | heavy weight | strong strength | win winner | interesting fun cool |
    merge combine concatenate join | translate say | stop prevent | symptom sign | lose missing |
    ask request | each every per | substitute replacement alternative instead replace | mac macos
    osx | increase raise boost grow | decrease reduce lower lessen | normal typical usual average
    standard | login signin | setup configure configuration config | reply respond answer | begin
    start | end finish | shipping delivery | sea ocean | center centre middle | color colour | gray
    grey | favorite favourite | optimize optimise | organize organise | program programming code
    coding | enable activate | disable deactivate | decline refuse reject | invitation invite |
    overheat hot heat | world earth globe | amount quantity | number count | money cash funds |
    purpose point | job position role | ensure guarantee | go golang | js javascript | py python |
    couch sofa | fridge refrigerator | tap faucet | leak drip | stovetop stove | downtown center |
    skillet pan | forgot forget | reason cause | cancellation cancel
    """.split("|")
]

# Opposites (matched after stemming). Generic prefix pairs are handled separately.
_ANTONYM_PAIRS = _pairs(
    """
    increase/decrease increase/reduce raise/lower rise/fall rising/falling gain/lose before/after
    max/min maximum/minimum maximize/minimize buy/sell hot/cold warm/cold heat/cool add/remove
    add/delete add/subtract enable/disable upload/download import/export start/stop start/end
    begin/end open/close open/closed win/lose up/down push/pull input/output above/below over/under
    more/less more/fewer most/least high/low higher/lower highest/lowest cheap/expensive
    cheapest/expensive fast/slow faster/slower first/last early/late earliest/latest left/right
    north/south east/west positive/negative true/false accept/reject allow/block allow/deny
    include/exclude inner/outer ascending/descending asc/desc forward/backward front/back
    lend/borrow deposit/withdraw credit/debit arrival/departure arrive/depart inbound/outbound
    incoming/outgoing send/receive success/failure pro/con advantage/disadvantage benefit/risk
    benefit/drawback best/worst better/worse safe/dangerous legal/illegal odd/even light/dark
    heavy/light wet/dry male/female men/women man/woman boy/girl adult/child past/future old/new
    oldest/newest young/old big/small large/small long/short wide/narrow thick/thin soft/hard
    strong/weak sunrise/sunset join/leave hire/fire enter/exit merge/split top/bottom read/write
    encode/decode serialize/deserialize plus/minus multiply/divide always/never all/none many/few
    love/hate internal/external public/private client/server frontend/backend show/hide sync/async
    static/dynamic mutable/immutable uppercase/lowercase upper/lower prefix/suffix head/tail
    day/night morning/evening summer/winter spring/autumn spring/fall inhale/exhale import/export
    win/loss profit/loss attack/defend rich/poor healthy/unhealthy good/bad love/dislike
    like/dislike accelerate/decelerate login/logout inside/outside asleep/awake sleep/wake
    full/empty clean/dirty easy/hard easy/difficult easiest/hardest strongest/weakest
    biggest/smallest largest/smallest longest/shortest busiest/quietest busy/quiet
    expensive/affordable to/from into/from on/off in/out keep/discard keep/delete save/discard
    approve/deny agree/disagree pass/fail yes/no online/offline remote/local local/remote raw/cooked
    overcooked/undercooked thaw/freeze husband/wife parent/child teacher/student employer/employee
    landlord/tenant buyer/seller borrower/lender debtor/creditor
    remember/forgot eat/avoid within/after during/after include/exclude included/excluded
    """,
    "/",
)
_PREFIX_SWAPS = [
    ("in", "de"),
    ("in", "ex"),
    ("im", "ex"),
    ("in", "out"),
    ("up", "down"),
    ("over", "under"),
    ("pre", "post"),
    ("en", "de"),
    ("en", "dis"),
    ("hyper", "hypo"),
    ("max", "min"),
    ("inter", "intra"),
    ("ac", "de"),
    ("ascend", "descend"),
]
_NEG_PREFIXES = ("un", "dis", "in", "im", "il", "ir", "non", "de", "anti", "counter")

# Irregular inflections the suffix stripper cannot see.
_IRREGULAR = _mapping(
    """
    got>get gotten>get bought>buy won>win made>make took>take taken>take went>go gone>go ran>run
    wrote>write written>write saw>see seen>see knew>know known>know ate>eat eaten>eat drank>drink
    lost>lose sent>send paid>pay said>say sold>sell kept>keep felt>feel thought>think told>tell
    found>find gave>give given>give broke>break broken>break chose>choose chosen>choose began>begin
    begun>begin fell>fall fallen>fall grew>grow grown>grow forgotten>forgot people>person men>man
    women>woman feet>foot teeth>tooth mice>mouse children>child bitten>bite driven>drive
    drove>drive flew>fly flown>fly held>hold built>build spent>spend meant>mean met>meet
    brought>bring caught>catch taught>teach sought>seek understood>understand stood>stand led>lead
    slept>sleep woke>wake
    """,
    ">",
)

_NEGATIONS = frozenset(
    {
        "not",
        "no",
        "never",
        "none",
        "nobody",
        "nothing",
        "nowhere",
        "neither",
        "nor",
        "without",
        "unable",
        "non",  # "non-refundable" splits into "non" + "refundable"
        "lack",
        "lacks",
        "lacking",
        "fail",
        "fails",
        "failed",
        "failing",
    }
)

_NON_WORDS = frozenset({"nonetheless", "nonsense", "nonprofit", "nonstop"})

# Role-bearing prepositions: a shared word that changes role between these flips the relation.
_ROLE_PREPS = {
    "from": "src",
    "to": "dst",
    "into": "dst",
    "onto": "dst",
    "toward": "dst",
    "towards": "dst",
    "than": "cmp",
}
# Function words that can be the pivot of a swap ("X to Y", "X of Y"); content words always can.
_PIVOT_FUNCTION_WORDS = frozenset(
    {"to", "from", "into", "onto", "than", "by", "of", "over", "under", "after", "before", "above", "below"}
)
_CONJUNCTIONS = frozenset({"and", "or", "but", "while", "plus", "also", "except", "unless", "whereas"})
_WH_WORDS = frozenset({"what", "why", "how", "when", "where", "who", "which", "whose", "whom"})
# Connectives whose two sides can be swapped without changing the question.
_SYMMETRIC = frozenset({"and", "or", "vs", "v", "with", "between", "nor", "&", "+", "plus", "versus"})

_NUM_WORDS = {
    k: float(v)
    for k, v in _mapping(
        """
        zero=0 one=1 two=2 three=3 four=4 five=5 six=6 seven=7 eight=8 nine=9 ten=10 eleven=11
        twelve=12 thirteen=13 fourteen=14 fifteen=15 sixteen=16 seventeen=17 eighteen=18 nineteen=19
        twenty=20 thirty=30 forty=40 fifty=50 sixty=60 seventy=70 eighty=80 ninety=90 dozen=12
        half=0.5 twice=2 double=2 triple=3 single=1
        """,
        "=",
    ).items()
}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINALS = {
    k: int(v)
    for k, v in _mapping(
        """
        first=1 second=2 third=3 fourth=4 fifth=5 sixth=6 seventh=7 eighth=8 ninth=9 tenth=10
        eleventh=11 twelfth=12 twentieth=20 thirtieth=30 hundredth=100
        """,
        "=",
    ).items()
}
# Values that mostly appear as words without being a quantity ("one of", "first time", "single page").
_WEAK_VALUES = {1.0, 2.0}
_WEAK_WORDS = frozenset({"one", "first", "single", "double", "twice", "half", "second"})

_UNITS = _mapping(
    """
    mg=mg milligram=mg milligrams=mg g=g gram=g grams=g gr=g kg=kg kilo=kg kilos=kg kilogram=kg
    kilograms=kg lb=lb lbs=lb pound=lb pounds=lb oz=oz ounce=oz ounces=oz ml=ml milliliter=ml
    milliliters=ml millilitre=ml l=l liter=l liters=l litre=l litres=l cup=cup cups=cup tbsp=tbsp
    tablespoon=tbsp tablespoons=tbsp tsp=tsp teaspoon=tsp teaspoons=tsp km=km kilometer=km
    kilometers=km kilometre=km kilometres=km mi=mile mile=mile miles=mile m=m meter=m meters=m
    metre=m metres=m cm=cm mm=mm inch=inch inches=inch in=inch ft=ft foot=ft feet=ft yard=yard
    yards=yard %=% percent=% pct=% gb=gb mb=mb tb=tb kb=kb ghz=ghz mhz=mhz mph=mph kph=kmh kmh=kmh
    w=w watt=w watts=w kw=kw kwh=kwh v=v volt=v volts=v am=am pm=pm sec=s second=s seconds=s s=s
    min=min mins=min minute=min minutes=min h=h hr=h hrs=h hour=h hours=h day=day days=day week=week
    weeks=week month=month months=month year=year years=year yr=year yrs=year $=usd usd=usd
    dollar=usd dollars=usd €=eur eur=eur euro=eur euros=eur £=gbp gbp=gbp quid=gbp ¥=jpy yen=jpy
    jpy=jpy °=deg degree=deg degrees=deg deg=deg k=thousand
    """,
    "=",
)
_TEMP_SCALES = {"c": "degC", "celsius": "degC", "centigrade": "degC", "f": "degF", "fahrenheit": "degF"}
_CURRENCY_PREFIX = {"$", "€", "£", "¥"}

_WEEKDAYS = {
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "sunday": "sun",
    "mondays": "mon",
    "tuesdays": "tue",
    "wednesdays": "wed",
    "thursdays": "thu",
    "fridays": "fri",
    "saturdays": "sat",
    "sundays": "sun",
}
_WEEKDAY_ABBR = {
    "mon": "mon",
    "tue": "tue",
    "tues": "tue",
    "wed": "wed",
    "thu": "thu",
    "thur": "thu",
    "thurs": "thu",
    "fri": "fri",
    "sat": "sat",
    "sun": "sun",
}
_MONTHS = {
    "january": 1,
    "february": 2,
    "march": 3,
    "april": 4,
    "may": 5,
    "june": 6,
    "july": 7,
    "august": 8,
    "september": 9,
    "october": 10,
    "november": 11,
    "december": 12,
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "sept": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}
# Month names that are also ordinary words: counted only when capitalized mid-sentence or next to a
# number or after a time preposition.
_AMBIGUOUS_MONTHS = frozenset(
    {"may", "march", "jan", "mar", "jun", "jul", "aug", "sep", "oct", "nov", "dec", "apr", "feb", "sept"}
)
_TIME_PREPS = frozenset(
    {
        "in",
        "of",
        "on",
        "by",
        "until",
        "till",
        "since",
        "during",
        "early",
        "late",
        "mid",
        "before",
        "after",
        "from",
        "to",
        "this",
        "next",
        "last",
        "every",
    }
)
_RELATIVE_TIME = {
    "today": "today",
    "tonight": "tonight",
    "tomorrow": "tomorrow",
    "yesterday": "yesterday",
    "weekend": "weekend",
    "weekends": "weekend",
    "weekday": "weekday",
    "weekdays": "weekday",
    "morning": "morning",
    "mornings": "morning",
    "afternoon": "afternoon",
    "evening": "evening",
    "evenings": "evening",
    "noon": "noon",
    "midnight": "midnight",
    "night": "night",
    "nights": "night",
    "overnight": "night",
    "christmas": "christmas",
    "easter": "easter",
    "thanksgiving": "thanksgiving",
    "halloween": "halloween",
    "summer": "summer",
    "winter": "winter",
    "autumn": "autumn",
}
_SEASON_AMBIGUOUS = {"spring": "spring", "fall": "autumn"}
_TIME_UNITS = frozenset(
    {
        "week",
        "month",
        "year",
        "weekend",
        "quarter",
        "season",
        "time",
        "semester",
        "summer",
        "winter",
        "autumn",
        "spring",
        "fall",
        "night",
        "morning",
        "evening",
        "decade",
        "century",
    }
    | set(_WEEKDAYS)
    | set(_MONTHS)
)
_TIME_DEICTIC = frozenset({"next", "last", "this", "previous", "coming", "past", "upcoming"})

_AUX_START = frozenset(
    {
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "can",
        "could",
        "should",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "have",
        "has",
        "had",
        "am",
    }
)
_HOW_MEASURE = frozenset(
    {
        "much",
        "many",
        "long",
        "far",
        "old",
        "big",
        "tall",
        "deep",
        "fast",
        "often",
        "large",
        "heavy",
        "high",
        "wide",
        "soon",
        "early",
        "late",
        "expensive",
        "hot",
        "cold",
        "strong",
        "safe",
        "likely",
        "common",
        "bad",
    }
)
# "what ..." openings that are really another question type.
_WHAT_AS = [
    (
        re.compile(
            r"\bwhat (?:is|are|was|were)? ?(?:the )?(?:main )?(?:reasons?|causes?) (?:for|of|why|behind)\b"
        ),
        "why",
    ),
    (re.compile(r"\bwhat (?:causes|caused|makes|made|leads to|led to)\b"), "why"),
    (re.compile(r"\bfor what reason\b"), "why"),
    (
        re.compile(
            r"\bwhat (?:is|are) (?:the )?"
            r"(?:best |right |proper |easiest |quickest |fastest |correct |simplest )?"
            r"(?:way|ways|steps|process|procedure|method)\b"
        ),
        "how",
    ),
    (re.compile(r"\bwhat (?:time|day|date|year|month)\b(?! zone)"), "when"),
    (re.compile(r"\bwhat (?:is|are) (?:the )?(?:cost|price|number|amount|count)\b"), "how_much"),
    (re.compile(r"\bin (?:what|which) (?:city|country|place|town|state|region)\b"), "where"),
]

# All phrase rewrites in one pass (one alternation, group pN = _PHRASES[N]).
_PHRASE_RE = re.compile("|".join(f"(?P<p{i}>{pat})" for i, (pat, _rep) in enumerate(_PHRASES)))
_TOKEN_RE = re.compile(r"\d+(?:[.,:/]\d+)*(?:st|nd|rd|th)?|[a-z0-9]+(?:'[a-z]+)*|[%$€£¥°&+]|[,;:?!.]", re.I)
# Clause boundaries (punctuation) become this marker: fronted phrases ("Madrid weather, how do I
# check it?") must not look like swapped arguments.
_BOUNDARY = "|"
_NUMBERISH = re.compile(r"^\d+(?:[.,:/]\d+)*$")
_ORDINAL_DIGITS = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
_NUM_UNIT = re.compile(r"^(\d+(?:\.\d+)?)([a-z%°]+)$")


def _stem(w: str) -> str:
    """Light suffix stripping (plural, -ing, -ed, -ly, final -e) so inflections compare equal."""
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith(("ches", "shes", "xes", "zes", "sses")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is", "ous")):
        w = w[:-1]
    if w.endswith("ing") and len(w) > 5:
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "ls":
            w = w[:-1]
        elif len(w) > 2 and w[-1] == w[-2] == "l":
            w = w[:-1]
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] != "s":
            w = w[:-1]
    elif w.endswith("ly") and len(w) > 5:
        w = w[:-2]
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    if w.endswith("y") and len(w) > 3:
        w = w[:-1] + "i"
    return w


def _build_synonyms() -> dict[str, str]:
    out: dict[str, str] = {}
    for words in _SYNONYM_GROUPS:
        head = _stem(words[0])  # the first word of a group names it
        for w in words:
            out.setdefault(_stem(w), head)
    return out


_SYN = _build_synonyms()


def _canon(stem: str) -> str:
    return _SYN.get(stem, stem)


_ANTONYMS: dict[str, set[str]] = {}
for _a, _b in _ANTONYM_PAIRS:
    _ANTONYMS.setdefault(_canon(_stem(_a)), set()).add(_canon(_stem(_b)))
    _ANTONYMS.setdefault(_canon(_stem(_b)), set()).add(_canon(_stem(_a)))
_STOP_STEMS = frozenset(_stem(w) for w in _STOPWORDS)
_FRAMING_STEMS = frozenset(_stem(w) for w in _FRAMING)


# Unit words that are not also common words or letters: "ounces" matches "oz" even with no number.
_UNIT_WORDS = {
    w: u
    for w, u in _UNITS.items()
    if len(w) > 1 and w.isalpha() and w not in {"in", "am", "pm", "min", "second", "sec", "day", "days"}
}


def _word_key(w: str) -> str:
    """What a word is compared by: its unit, or else the head of its stem's synonym group."""
    unit = _UNIT_WORDS.get(w)
    if unit is not None:
        return "unit:" + unit
    return _canon(_stem(w))


def _damerau(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance, giving up (returning limit+1) once it exceeds `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


def _is_typo(a: str, b: str) -> bool:
    """Plausible misspelling of one another: longer words tolerate more edits."""
    n = min(len(a), len(b))
    if n < 4 or not (a.isalpha() and b.isalpha()):
        return False
    if n < 6:
        return a[0] == b[0] and _damerau(a, b, 1) <= 1
    return _damerau(a, b, 2 if n >= 8 else 1) <= (2 if n >= 8 else 1)


# ---------------------------------------------------------------------------------------------
# Per-text analysis


@dataclass(frozen=True)
class Token:
    text: str  # lowercase surface form
    stem: str  # comparison key: unit, or synonym-group head of the stem (see _word_key)
    specific: bool  # proper noun, acronym or code-like (version, error code)
    content: bool  # counts as a content word
    anchor: bool  # can take part in a swap: content words, numbers, weekdays and months


@dataclass(frozen=True)
class Analysis:
    norm: str
    tokens: tuple[Token, ...]
    negations: int
    quantities: tuple[tuple[str, str | None, bool], ...]  # (value, unit, weak)
    codes: frozenset[str]
    times: frozenset[str]
    qtypes: frozenset[str]
    yesno: bool
    words: Counter[str] = field(compare=False)  # stems of all tokens, function words included


def _normalize(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'").replace("`", "'")
    t = t.replace("“", '"').replace("”", '"')
    return t


def _expand_contractions(low: str) -> str:
    def repl(m: re.Match[str]) -> str:
        w = m.group(0)
        if w in _CONTRACTIONS:
            return _CONTRACTIONS[w]
        for suf, rep in _SUFFIX_CONTRACTIONS:
            if w.endswith(suf):
                return w[: -len(suf)] + rep
        return w

    return re.sub(r"[a-z]+(?:'[a-z]+)?", repl, low)


def _parse_numbers(words: list[str]) -> tuple[list[tuple[float, int, int, bool]], set[int]]:
    """Number words and digits -> [(value, start, end, weak)], plus the positions they cover."""
    out: list[tuple[float, int, int, bool]] = []
    used: set[int] = set()
    i = 0
    while i < len(words):
        w = words[i]
        if _NUMBERISH.match(w) and "/" not in w and ":" not in w:
            raw = w.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+", w) else w.replace(",", ".")
            try:
                val = float(raw)
            except ValueError:
                i += 1
                continue
            j = i + 1
            if j < len(words) and words[j] in _SCALES:
                val *= _SCALES[words[j]]
                j += 1
            out.append((val, i, j, False))
            used.update(range(i, j))
            i = j
            continue
        m = _ORDINAL_DIGITS.match(w)
        if m:
            out.append((float(m.group(1)), i, i + 1, False))
            used.add(i)
            i += 1
            continue
        if w in _ORDINALS:
            out.append((float(_ORDINALS[w]), i, i + 1, w in _WEAK_WORDS))
            used.add(i)
            i += 1
            continue
        if w in _NUM_WORDS or (w in _SCALES and i > 0 and words[i - 1] in ("a", "one")):
            total, cur, j = 0.0, 0.0, i
            start_weak = w in _WEAK_WORDS
            while j < len(words) and (words[j] in _NUM_WORDS or words[j] in _SCALES or words[j] == "and"):
                x = words[j]
                if x == "and":
                    if j + 1 < len(words) and (words[j + 1] in _NUM_WORDS) and cur >= 100:
                        j += 1
                        continue
                    break
                if x in _SCALES:
                    cur = (cur or 1.0) * _SCALES[x]
                    if _SCALES[x] >= 1000:
                        total += cur
                        cur = 0.0
                else:
                    cur += _NUM_WORDS[x]
                j += 1
            val = total + cur
            weak = start_weak and j == i + 1
            if w == "dozen" or (w in _SCALES):
                weak = False
            out.append((val, i, j, weak))
            used.update(range(i, j))
            i = j
            continue
        i += 1
    return out, used


@lru_cache(maxsize=8192)
def analyze(text: str) -> Analysis:
    """Everything the rules need about one text. Memoized: cached prompts are checked repeatedly."""
    t = _normalize(text)
    # Thousands separators and "-free" compounds before splitting on punctuation.
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
    # "gluten-free" is "without gluten": a negation, and the same words as the spelled-out form.
    t = re.sub(r"\b([a-z]+)-free\b", r"without \1", t, flags=re.I)
    # Hyphens split words ("three-day" -> "three day"); "e-mail" still matches "email" through the
    # split-word check in content_diff.
    orig_tokens = _TOKEN_RE.findall(t)
    low = _expand_contractions(t.lower())
    low = _PHRASE_RE.sub(lambda m: _PHRASES[int(m.lastgroup[1:])][1], low)  # type: ignore[index]
    raw = _TOKEN_RE.findall(low)
    # Split "100ml", "5mg", "3pm", "180°c" into value + unit; strip ordinal suffixes.
    words: list[str] = []
    for w in raw:
        m = _NUM_UNIT.match(w)
        if m and (
            m.group(2) in _UNITS or m.group(2) in _TEMP_SCALES or m.group(2) in ("st", "nd", "rd", "th")
        ):
            if m.group(2) in ("st", "nd", "rd", "th"):
                words.append(m.group(1))
            else:
                words.extend([m.group(1), m.group(2)])
        else:
            words.append(w)
    surface = [w.replace("'", "") for w in words]  # before irregular forms: "wrote" is no request framing
    words = [
        "plus" if w == "+" else _BOUNDARY if w in ",;:?!." else _IRREGULAR.get(w, w).replace("'", "")
        for w in words
    ]
    norm = " ".join(w for w in words if w != _BOUNDARY)

    # Capitalization of the original: proper nouns and acronyms (not sentence-initial, not "I").
    caps: set[str] = set()
    sentence_start = True
    for ot in orig_tokens:
        if ot in ".?!":
            sentence_start = True
            continue
        o = ot.replace("'", "")
        if (
            (o[:1].isupper() and not sentence_start and o.lower() != "i")
            or (len(o) >= 2 and o.isupper())
            or (any(c.isupper() for c in o[1:]) and any(c.islower() for c in o))
        ):
            caps.add(o.lower())
        sentence_start = False

    nums, num_pos = _parse_numbers(words)
    quantities: list[tuple[str, str | None, bool]] = []
    unit_pos: set[int] = set()
    for val, start, end, weak in nums:
        unit: str | None = None
        j = end
        # "in" after a number is a preposition far more often than inches ("$500 in small claims
        # court"): an inch only at the end of a clause ("12 in").
        inch_word = j < len(words) and words[j] == "in" and j + 1 < len(words) and words[j + 1] != _BOUNDARY
        if start > 0 and words[start - 1] in _CURRENCY_PREFIX:
            unit = _UNITS[words[start - 1]]
            unit_pos.add(start - 1)
        elif j < len(words) and words[j] in _UNITS and not inch_word:
            unit = _UNITS[words[j]]
            unit_pos.add(j)
            if unit == "deg" and j + 1 < len(words) and words[j + 1] in _TEMP_SCALES:
                unit = _TEMP_SCALES[words[j + 1]]
                unit_pos.add(j + 1)
        if unit == "thousand":
            val *= 1000
            unit = None
        # 1 is as often "a"/"an" as a quantity ("a pound" vs "1 lb"): it never vetoes on its own.
        quantities.append((f"{val:g}", unit, (weak and val in _WEAK_VALUES) or val == 1.0))

    codes = frozenset(
        w
        for i, w in enumerate(words)
        if i not in num_pos and any(c.isdigit() for c in w) and not _NUMBERISH.match(w)
    ) | frozenset(w for w in words if "/" in w or ":" in w)

    # Dates and times.
    times: set[str] = set()
    time_pos: set[int] = set()
    for i, w in enumerate(words):
        before = len(times)
        prev = words[i - 1] if i > 0 else ""
        nxt = words[i + 1] if i + 1 < len(words) else ""
        near_num = bool(_NUMBERISH.match(prev) or _NUMBERISH.match(nxt) or _ORDINAL_DIGITS.match(nxt))
        if w in _WEEKDAYS:
            times.add(_WEEKDAYS[w])
        elif w in _WEEKDAY_ABBR and (prev in _TIME_PREPS or near_num or w in caps):
            times.add(_WEEKDAY_ABBR[w])
        elif w in _MONTHS:
            if w not in _AMBIGUOUS_MONTHS or w in caps or near_num or prev in _TIME_PREPS:
                if w == "may" and prev not in _TIME_PREPS and not near_num and i == 0:
                    continue
                times.add(f"month{_MONTHS[w]}")
        elif w in _RELATIVE_TIME:
            times.add(_RELATIVE_TIME[w])
        elif w in _SEASON_AMBIGUOUS and prev in _TIME_PREPS | {"the"}:
            times.add(_SEASON_AMBIGUOUS[w])
        if len(times) > before:
            time_pos.add(i)
        if w in _TIME_DEICTIC and nxt and (nxt in _TIME_UNITS or _stem(nxt) in _TIME_UNITS):
            times.add(f"{'this' if w in ('this', 'coming', 'upcoming') else w}:{_stem(nxt)}")
            time_pos.update((i, i + 1))

    # Question type.
    qtypes: set[str] = set()
    for pat, qt in _WHAT_AS:
        if pat.search(low):
            qtypes.add(qt)
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w == "why":
            qtypes.add("why")
        elif w == "how":
            qtypes.add("how_much" if nxt in _HOW_MEASURE else "how")
        elif w == "when":
            qtypes.add("when")
        elif w == "where":
            # "where do I report a bug" asks for a procedure as much as "how do I report a bug".
            procedural = (
                nxt in ("do", "can", "should") and i + 2 < len(words) and words[i + 2] in ("i", "we", "you")
            )
            qtypes.add("where_how" if procedural else "where")
        elif w in ("who", "whom", "whose"):
            qtypes.add("who")
    yesno = bool(words) and words[0] in _AUX_START and not qtypes

    # Glued "non" compounds negate too ("nonrefundable", "nonsmoking"); "nonetheless" does not.
    negations = sum(
        1 for w in words if w in _NEGATIONS or (w.startswith("non") and len(w) >= 7 and w not in _NON_WORDS)
    )

    skip = num_pos | unit_pos | time_pos
    tokens: list[Token] = []
    for i, w in enumerate(words):
        if not w or w in "%$€£¥°&+":
            continue
        if w == _BOUNDARY:
            tokens.append(Token(w, w, False, False, False))
            continue
        stem = _word_key(w)
        # Stopword and framing lists apply to the word itself, not its synonym group: "make" frames
        # a request, "create" (same group) does not.
        raw_stem = _stem(surface[i])
        content = (
            i not in skip and w not in _STOPWORDS and raw_stem not in _STOP_STEMS and w not in _NEGATIONS
        )
        content = content and raw_stem not in _FRAMING_STEMS
        specific = content and (w in caps or any(c.isdigit() for c in w))
        anchor = content or (i in num_pos) or (i in time_pos and (w in _WEEKDAYS or w in _MONTHS))
        tokens.append(Token(w, stem, specific, content, anchor))
    return Analysis(
        norm=norm,
        tokens=tuple(tokens),
        negations=negations,
        quantities=tuple(quantities),
        codes=codes,
        times=frozenset(times),
        qtypes=frozenset(qtypes),
        yesno=yesno,
        words=Counter(_word_key(w) for w in words if w != _BOUNDARY),
    )


# ---------------------------------------------------------------------------------------------
# Rules. Each returns None (no objection) or a detail string explaining the veto.


def _rule_negation(a: Analysis, b: Analysis) -> str | None:
    if a.negations != b.negations:
        return f"negations {a.negations} vs {b.negations}"
    return None


def _rule_number(a: Analysis, b: Analysis) -> str | None:
    def strong(x: Analysis) -> Counter[str]:
        return Counter(v for v, _u, weak in x.quantities if not weak)

    def every(x: Analysis) -> set[str]:
        return {v for v, _u, _w in x.quantities}

    sa, sb = strong(a), strong(b)
    missing_b = [v for v in sa if v not in every(b)]
    missing_a = [v for v in sb if v not in every(a)]
    if missing_a or missing_b:
        return f"numbers {sorted(every(a))} vs {sorted(every(b))}"
    units_a: dict[str, set[str]] = {}
    units_b: dict[str, set[str]] = {}
    for v, u, _w in a.quantities:
        if u:
            units_a.setdefault(v, set()).add(u)
    for v, u, _w in b.quantities:
        if u:
            units_b.setdefault(v, set()).add(u)
    for v in set(units_a) & set(units_b):
        ua, ub = units_a[v], units_b[v]
        # "100 degrees" vs "100°F": a bare degree is compatible with a scale.
        ua_cmp = {("deg" if x in ("degC", "degF") and "deg" in ub else x) for x in ua}
        ub_cmp = {("deg" if x in ("degC", "degF") and "deg" in ua else x) for x in ub}
        if not (ua_cmp & ub_cmp):
            return f"units of {v}: {sorted(ua)} vs {sorted(ub)}"
    if a.codes != b.codes:
        return f"codes {sorted(a.codes)} vs {sorted(b.codes)}"
    return None


def _rule_date(a: Analysis, b: Analysis) -> str | None:
    if a.times != b.times:
        return f"times {sorted(a.times)} vs {sorted(b.times)}"
    return None


_SPECIFIC_Q = frozenset({"why", "how", "when", "where", "who", "how_much"})


def _qset(x: Analysis) -> frozenset[str]:
    q = set(x.qtypes)
    if "where_how" in q:
        q.discard("where_how")
        q.update(("where", "how"))
    return frozenset(q) & _SPECIFIC_Q


def _rule_question(a: Analysis, b: Analysis) -> str | None:
    qa, qb = _qset(a), _qset(b)
    if qa and qb and not (qa & qb):
        return f"question {sorted(qa)} vs {sorted(qb)}"
    # A yes/no question and a why/when/where/who/how-much question want different answers;
    # "can I X" vs "how do I X" usually do not.
    for yn, other in ((a, qb), (b, qa)):
        if yn.yesno and other and not (other <= {"how"}):
            return f"question yes/no vs {sorted(other)}"
    return None


def _prefix_opposite(u: str, v: str) -> bool:
    for p in _NEG_PREFIXES:
        # Short roots only for the unambiguous prefixes ("zip"/"unzip"); "dis"+"play" is no opposite.
        root = 3 if p in ("un", "non", "anti") else 4
        if (v == p + u or u == p + v) and min(len(u), len(v)) >= root:
            return True
    for p, q in _PREFIX_SWAPS:
        for x, y in ((u, v), (v, u)):
            if x.startswith(p) and y.startswith(q) and x[len(p) :] == y[len(q) :] and len(x) - len(p) >= 3:
                return True
    for x, y in ((u, v), (v, u)):
        if x.endswith("ful") and y.endswith("less") and x[:-3] == y[:-4]:
            return True
    return False


def _rule_antonym(a: Analysis, b: Analysis) -> str | None:
    only_a = list((a.words - b.words).elements())
    only_b = list((b.words - a.words).elements())
    for u in only_a:
        for v in only_b:
            if v in _ANTONYMS.get(u, ()) or _prefix_opposite(u, v):
                return f"opposites {u!r} vs {v!r}"
    return None


def _roles(x: Analysis) -> dict[str, str]:
    """Shared-word role from the nearest preceding from/to/into/than within a short window."""
    out: dict[str, str] = {}
    toks = x.tokens
    for i, t in enumerate(toks):
        if not t.anchor:
            continue
        for k in range(i - 1, max(-1, i - 4), -1):
            p = toks[k]
            if p.text in _ROLE_PREPS:
                out.setdefault(t.stem, _ROLE_PREPS[p.text])
                break
            if p.content:
                break
    return out


def _kind(a: Analysis, b: Analysis, ia: int, ib: int) -> str:
    """num / name / word; a name capitalized mid-sentence on either side counts (sentence-initial
    capitals say nothing)."""
    ta, tb = a.tokens[ia], b.tokens[ib]
    if not ta.content:
        return "num"
    return "name" if ta.specific or tb.specific else "word"


def _rule_direction(a: Analysis, b: Analysis) -> str | None:
    def positions(x: Analysis) -> dict[str, list[int]]:
        pos: dict[str, list[int]] = {}
        for i, t in enumerate(x.tokens):
            pos.setdefault(t.stem, []).append(i)
        return pos

    pa, pb = positions(a), positions(b)
    # Words that occur once on each side; numbers and weekdays count ("12 divided by 4").
    anchors = [
        s
        for s, ps in pa.items()
        if len(ps) == 1 and len(pb.get(s, ())) == 1 and a.tokens[ps[0]].anchor and b.tokens[pb[s][0]].anchor
    ]
    # Bounded work on long prompts: the pair loop below is quadratic in anchors.
    anchors = anchors[:_MAX_ANCHORS]
    ra, rb = _roles(a), _roles(b)
    for s in anchors:
        if s in ra and s in rb and ra[s] != rb[s]:
            return f"role of {s!r}: {ra[s]} vs {rb[s]}"

    def pivots(x: Analysis, lo: int, hi: int, content_ok: bool) -> set[str] | None:
        out = set()
        for t in x.tokens[lo + 1 : hi]:
            if t.text in _SYMMETRIC:
                return None  # "X and Y", "X vs Y": swapping the sides is harmless
            if t.text == _BOUNDARY or t.text in _WH_WORDS:
                return None  # a fronted phrase ("Madrid weather, how do I check it?"), not a swap
            if t.text in _PIVOT_FUNCTION_WORDS or (content_ok and t.content):
                out.add(t.stem)
        return out

    for i, x in enumerate(anchors):
        for y in anchors[i + 1 :]:
            ax, ay, bx, by = pa[x][0], pa[y][0], pb[x][0], pb[y][0]
            if (ax < ay) == (bx < by):
                continue
            # A content word in between is a pivot ("Alice owes Bob", "dog eat cat food") only for
            # two words of the same kind; "format a date in Java" vs "Java date formatting" is not.
            content_ok = _kind(a, b, ax, bx) == _kind(a, b, ay, by)
            pa_set = pivots(a, min(ax, ay), max(ax, ay), content_ok)
            pb_set = pivots(b, min(bx, by), max(bx, by), content_ok)
            if pa_set is None or pb_set is None:
                continue
            common = (pa_set & pb_set) - {x, y}
            if common:
                return f"{x!r} and {y!r} swap around {sorted(common)[0]!r}"
    return None


@dataclass(frozen=True)
class ContentDiff:
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    specific: tuple[str, ...]


_MAX_TYPO_CANDIDATES = 32
_MAX_ANCHORS = 64


def content_diff(a: Analysis, b: Analysis) -> ContentDiff:
    """Content words of each side that have no counterpart on the other (stem, synonym, typo, split)."""

    def unmatched(x: Analysis, y: Analysis) -> list[Token]:
        y_stems = {t.stem for t in y.tokens} | {t.text for t in y.tokens}
        x_stems = {u.stem for u in x.tokens}
        y_left = [t for t in y.tokens if t.content and t.stem not in x_stems]
        # Typo matching is quadratic; long prompts that differ in many words are not typos anyway.
        if len(y_left) > _MAX_TYPO_CANDIDATES:
            y_left = []
        x_texts = [t.text for t in x.tokens]
        out = []
        for i, t in enumerate(x.tokens):
            if not t.content or t.stem in y_stems or t.text in y_stems:
                continue
            # Split on one side, glued on the other: "web site"/"website", "sci fi"/"scifi".
            if (i + 1 < len(x_texts) and x_texts[i] + x_texts[i + 1] in y_stems) or (
                i > 0 and x_texts[i - 1] + x_texts[i] in y_stems
            ):
                continue
            if any(_is_typo(t.text, u.text) or _is_typo(t.stem, u.stem) for u in y_left):
                continue
            out.append(t)
        return out

    ua, ub = unmatched(a, b), unmatched(b, a)
    # A word glued on this side that is split on the other ("login" vs "log in") was matched above
    # through the other side's pairs; drop it here too.
    b_pairs = {x.text + y.text for x, y in zip(b.tokens, b.tokens[1:], strict=False)}
    a_pairs = {x.text + y.text for x, y in zip(a.tokens, a.tokens[1:], strict=False)}
    ua = [t for t in ua if t.text not in b_pairs]
    ub = [t for t in ub if t.text not in a_pairs]
    specific = tuple(t.text for t in (*ua, *ub) if t.specific)
    return ContentDiff(tuple(t.text for t in ua), tuple(t.text for t in ub), specific)


_GUARDS = (
    ("negation", _rule_negation),
    ("number", _rule_number),
    ("date", _rule_date),
    ("question", _rule_question),
    ("antonym", _rule_antonym),
    ("direction", _rule_direction),
)


_HARD = "hard rule: "


class RuleVerifier:
    """Implements the cache's Verifier protocol: in scorer mode (the default) the learned pair
    scorer of cache.scorer decides, at the threshold that the wrong-serve budget picks from its
    calibration curve; in rules mode, the rules described in the module docstring.

    Before either: identical after normalization accepts, and a text the scorer cannot judge (not
    English) rejects, so a language the features were not built for can never be served wrongly.
    """

    def __init__(
        self,
        settings: VerifierSettings | None = None,
        *,
        max_wrong_rate: float | None = None,
        scorer: PairScorer | None = None,
    ) -> None:
        self.settings = settings or VerifierSettings.from_env()
        self.disabled = frozenset(r.strip() for r in self.settings.disabled_rules.split(",") if r.strip())
        unknown = self.disabled - set(RULES)
        if unknown:
            raise ValueError(f"SEMSERVE_VERIFY_DISABLED_RULES: unknown rules {sorted(unknown)}; know {RULES}")
        if self.settings.mode not in ("scorer", "rules"):
            raise ValueError(f"SEMSERVE_VERIFY_MODE: {self.settings.mode!r}, expected scorer or rules")
        self.hard = frozenset(r.strip() for r in self.settings.hard_rules.split(",") if r.strip())
        if self.hard - set(RULES[:-1]):
            raise ValueError(f"SEMSERVE_VERIFY_HARD_RULES: unknown rules {sorted(self.hard - set(RULES))}")
        self.scorer: PairScorer | None = None
        self.threshold = 1.01
        if self.settings.mode == "scorer":
            from cache.scorer import default_scorer

            # Loaded at start, not on the first request: a missing or stale file fails the start.
            self.scorer = scorer or default_scorer(str(self.settings.scorer_path or ""))
            if max_wrong_rate is None:
                from cache.settings import CacheSettings

                max_wrong_rate = CacheSettings.from_env().max_wrong_rate
            self.use_max_wrong_rate(max_wrong_rate)

    def use_max_wrong_rate(self, max_wrong_rate: float) -> None:
        """Move the operating point to the calibrated threshold for this wrong-serve budget."""
        if not 0.0 <= max_wrong_rate <= 1.0:
            raise ValueError(f"max wrong rate {max_wrong_rate} is not in [0, 1]")
        self.max_wrong_rate = max_wrong_rate
        if self.scorer is not None:
            point = self.scorer.threshold_for(max_wrong_rate)
            self.threshold = point.threshold
            log.info(
                "verify_operating_point",
                max_wrong_rate=max_wrong_rate,
                threshold=round(point.threshold, 4),
                calib_wrong_rate=point.wrong_rate,
                calib_served_rate=point.served_rate,
            )

    def check(self, query: str, candidate: str, similarity: float) -> Verdict:
        verdict = self._decide(query, candidate, similarity)
        log.debug(
            "verify_decision",
            accept=verdict.accept,
            rule=verdict.rule,
            score=round(verdict.score, 4),
            # `detail` names the differing words, i.e. prompt content: logs carry none of it.
        )
        return verdict

    def _decide(self, query: str, candidate: str, similarity: float) -> Verdict:
        s = self.settings
        a, b = analyze(query), analyze(candidate)
        if not a.norm or not b.norm:
            return Verdict(False, "empty", similarity, "nothing to compare after normalization")
        if a.norm == b.norm:
            return Verdict(True, "exact", similarity, "identical after normalization")
        if not (is_english(query) and is_english(candidate)):
            # The lexicons and the scorer's features are English: on other text they cannot tell a
            # paraphrase from a look-alike, so only identical prompts (above) are served.
            return Verdict(False, "unsupported_language", similarity, "not English: only exact repeats")
        if similarity < s.min_similarity:
            return Verdict(False, "below_floor", similarity, f"cosine {similarity:.3f} < {s.min_similarity}")
        if self.scorer is not None:
            return self._score(query, candidate, similarity)
        for name, rule in _GUARDS:
            if name in self.disabled:
                continue
            why = rule(a, b)
            if why is not None:
                return Verdict(False, name, similarity, why)
        if "content" in self.disabled:
            ok = similarity >= s.accept_clean
            return Verdict(ok, "similarity", similarity, f"cosine {similarity:.3f} vs {s.accept_clean}")
        diff = content_diff(a, b)
        if not diff.only_a and not diff.only_b:
            ok = similarity >= s.accept_clean
            return Verdict(
                ok,
                "content_clean",
                similarity,
                f"all content words matched; cosine {similarity:.3f} vs {s.accept_clean}",
            )
        detail = f"unmatched {list(diff.only_a)} vs {list(diff.only_b)}"
        if diff.only_a and diff.only_b:
            n = max(len(diff.only_a), len(diff.only_b))
            ok = not diff.specific and n <= s.max_substituted and similarity >= s.accept_substituted
            return Verdict(
                ok,
                "content_substituted",
                similarity,
                f"{detail}; cosine {similarity:.3f} vs {s.accept_substituted}",
            )
        # Extra words joined by a conjunction only one side has ("horizontally and vertically",
        # "... but keep the changes") add a requirement: a wider question, never the same one.
        extra = (a.words - b.words) if diff.only_a else (b.words - a.words)
        conj = sorted(set(extra) & _CONJUNCTIONS)
        if conj:
            return Verdict(False, "content_added", similarity, f"{detail}; added clause with {conj[0]!r}")
        n = len(diff.only_a) + len(diff.only_b)
        ok = not diff.specific and n <= s.max_added and similarity >= s.accept_added
        return Verdict(
            ok, "content_added", similarity, f"{detail}; cosine {similarity:.3f} vs {s.accept_added}"
        )

    def probability(self, query: str, candidate: str, similarity: float) -> float:
        """The number `check` compares with the threshold in scorer mode: 1 for identical prompts,
        0 where a check before the scorer rejects (language, floor, hard rule), else the scorer's
        probability. For curves over all thresholds (`semserve cache eval --plot`)."""
        v = self._decide(query, candidate, similarity)
        if v.rule == "exact":
            return 1.0
        if self.scorer is None or v.rule in ("empty", "unsupported_language", "below_floor"):
            return 0.0
        if v.detail.startswith(_HARD):
            return 0.0
        return v.score

    def _score(self, query: str, candidate: str, similarity: float) -> Verdict:
        from cache.pairfeatures import pair_features

        assert self.scorer is not None
        x, vetoes = pair_features(query, candidate, similarity)
        objecting = [v for v in vetoes if v.removeprefix("rule_") not in self.disabled]
        for name in objecting:
            rule = name.removeprefix("rule_")
            if rule in self.hard:
                return Verdict(False, rule, similarity, f"{_HARD}{vetoes[name]}")
        p = self.scorer.probability(x)
        detail = f"score {p:.3f} vs {self.threshold:.3f} (cosine {similarity:.3f})"
        if p >= self.threshold:
            return Verdict(True, "scorer", p, detail)
        # Rejected: name the rule that objected, if any (the likeliest reason), else the score.
        if objecting:
            rule = objecting[0].removeprefix("rule_")
            return Verdict(False, rule, p, f"{detail}; {vetoes[objecting[0]]}")
        return Verdict(False, "scorer", p, detail)
