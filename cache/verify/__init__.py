"""The verification step: may the answer cached for one prompt be served for another?

    lexicon   word lists (pure data)
    analysis  one text -> the facts the rules compare (`analyze`, memoized)
    rules     the rules and `content_diff` (pure: also the pair scorer's features, cache.pairfeatures)
    verifier  RuleVerifier (the cache's Verifier): the rules alone, or the scorer over them

Settings: cache.settings.VerifierSettings; the similarity floor is CacheSettings.min_similarity.
"""

from cache.settings import RULES, VerifierSettings
from cache.verify.analysis import Analysis, Token, analyze
from cache.verify.rules import GUARDS, ContentDiff, content_diff
from cache.verify.verifier import RuleVerifier

__all__ = [
    "GUARDS",
    "RULES",
    "Analysis",
    "ContentDiff",
    "RuleVerifier",
    "Token",
    "VerifierSettings",
    "analyze",
    "content_diff",
]
