"""The verifier's word lists: general English, not tuned to any one evaluation pair; kept small and
explainable. Pure data (and the two one-line parsers that keep the lists compact); cache.verify.analysis
turns them into per-text facts, cache.verify.rules compares those.
"""

from __future__ import annotations

import re


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


CONTRACTIONS = _mapping(
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
SUFFIX_CONTRACTIONS = (
    ("n't", " not"),
    ("'re", " are"),
    ("'ve", " have"),
    ("'ll", " will"),
    ("'m", " am"),
    ("'d", " would"),
    ("'s", ""),
)

# Phrasal verbs and fixed phrases that have a one-word equivalent; applied before tokenizing.
PHRASES = [
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

STOPWORDS = frozenset(
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
FRAMING = frozenset(
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
SYNONYM_GROUPS = [
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
ANTONYM_PAIRS = _pairs(
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
PREFIX_SWAPS = [
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
NEG_PREFIXES = ("un", "dis", "in", "im", "il", "ir", "non", "de", "anti", "counter")

# Irregular inflections the suffix stripper cannot see.
IRREGULAR = _mapping(
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

NEGATIONS = frozenset(
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

NON_WORDS = frozenset({"nonetheless", "nonsense", "nonprofit", "nonstop"})

# Role-bearing prepositions: a shared word that changes role between these flips the relation.
ROLE_PREPS = {
    "from": "src",
    "to": "dst",
    "into": "dst",
    "onto": "dst",
    "toward": "dst",
    "towards": "dst",
    "than": "cmp",
}
# Function words that can be the pivot of a swap ("X to Y", "X of Y"); content words always can.
PIVOT_FUNCTION_WORDS = frozenset(
    {"to", "from", "into", "onto", "than", "by", "of", "over", "under", "after", "before", "above", "below"}
)
CONJUNCTIONS = frozenset({"and", "or", "but", "while", "plus", "also", "except", "unless", "whereas"})
WH_WORDS = frozenset({"what", "why", "how", "when", "where", "who", "which", "whose", "whom"})
# Connectives whose two sides can be swapped without changing the question.
SYMMETRIC = frozenset({"and", "or", "vs", "v", "with", "between", "nor", "&", "+", "plus", "versus"})

NUM_WORDS = {
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
SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
ORDINALS = {
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
WEAK_VALUES = {1.0, 2.0}
WEAK_WORDS = frozenset({"one", "first", "single", "double", "twice", "half", "second"})

UNITS = _mapping(
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
TEMP_SCALES = {"c": "degC", "celsius": "degC", "centigrade": "degC", "f": "degF", "fahrenheit": "degF"}
CURRENCY_PREFIX = {"$", "€", "£", "¥"}

WEEKDAYS = {
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
WEEKDAY_ABBR = {
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
MONTHS = {
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
AMBIGUOUS_MONTHS = frozenset(
    {"may", "march", "jan", "mar", "jun", "jul", "aug", "sep", "oct", "nov", "dec", "apr", "feb", "sept"}
)
TIME_PREPS = frozenset(
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
RELATIVE_TIME = {
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
SEASON_AMBIGUOUS = {"spring": "spring", "fall": "autumn"}
TIME_UNITS = frozenset(
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
    | set(WEEKDAYS)
    | set(MONTHS)
)
TIME_DEICTIC = frozenset({"next", "last", "this", "previous", "coming", "past", "upcoming"})

AUX_START = frozenset(
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
HOW_MEASURE = frozenset(
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
WHAT_AS = [
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
