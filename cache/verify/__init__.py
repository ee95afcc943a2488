"""The verification step: may the answer cached for one prompt be served for another?

    lexicon   word lists (pure data)
    analysis  one text -> the facts the rules compare (`analyze`, memoized)
    rules     the rules, `content_diff` and RuleVerifier (the cache's Verifier)

Settings: cache.settings.VerifierSettings; the similarity floor is CacheSettings.min_similarity.
"""

from cache.settings import RULES, VerifierSettings
from cache.verify.analysis import Analysis, Token, analyze
from cache.verify.rules import GUARDS, ContentDiff, RuleVerifier, content_diff

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
