"""Assemble and run the transformer: embedder, verifier, Redis store, cache policy, predictor
client, the KServe model, OpenAI and admin routes, and auth on every route."""

from __future__ import annotations

from typing import Any

from cache.embedder import Embedder
from cache.entry_store import EntryStore
from cache.interfaces import Judge
from cache.redis_client import make_client
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings, EmbedderSettings, VerifierSettings
from cache.tenant_counters import TenantCounters
from cache.verify import RuleVerifier
from semserve import logs, tracing
from semserve.serving.app_builder import Service, run_service
from semserve.tenant_limits import LimitsError
from transformers_svc import metrics
from transformers_svc.admin import register_admin_routes
from transformers_svc.admission import Admission, FairAdmission
from transformers_svc.answer_pipeline import AnswerPipeline
from transformers_svc.auth import Authenticator
from transformers_svc.auth_middleware import GrpcAuth, HttpAuth
from transformers_svc.config import TransformerSettings
from transformers_svc.fair_queue import FairQueue
from transformers_svc.judge import PredictorJudge
from transformers_svc.model import SemanticCacheTransformer
from transformers_svc.openai_backend import TransformerOpenAI
from transformers_svc.predictor_client import PredictorClient
from transformers_svc.request_log import RequestLog
from transformers_svc.saturation import Saturation, metrics_url_of
from transformers_svc.tenant_quota import TenantQuotas

log = logs.get_logger("semserve.transformer")


def build_cache(cache_settings: CacheSettings, embed_settings: EmbedderSettings,
                verify_settings: VerifierSettings, judge: Judge | None = None) -> SemanticCache:
    embedder = Embedder(embed_settings)
    store = EntryStore.from_settings(cache_settings)
    verifier = RuleVerifier(verify_settings, min_similarity=cache_settings.min_similarity)
    return SemanticCache(store, embedder, verifier, cache_settings, judge=judge)


def run(
    settings: TransformerSettings,
    cache_settings: CacheSettings,
    embed_settings: EmbedderSettings,
    verify_settings: VerifierSettings,
    trace_settings: tracing.TracingSettings | None = None,
) -> None:
    try:
        run_service(
            "transformer",
            settings,
            lambda: assemble(settings, cache_settings, embed_settings, verify_settings),
            trace_settings,
            # --record-prompt-text is also what lets prompt text onto spans.
            prompt_text_on_spans=settings.record_prompt_text,
        )
    except LimitsError as exc:  # a bad --tenant-limits-file: one line naming tenant and field
        log.error("tenant_limits_invalid", error=str(exc))
        raise SystemExit(2) from None


def build_admission(
    settings: TransformerSettings, cache_settings: CacheSettings, fair: FairAdmission | None = None
) -> Admission | None:
    """Admission of misses: per-tenant limits (--tenant-limits-file) on the cache's Redis, then the
    fair queue `fair`; None with neither. Raises LimitsError for a bad limits file."""
    path = settings.tenant_limits_file
    if path is None and fair is None:
        return None
    quotas = TenantQuotas(path)
    counters = TenantCounters(make_client(cache_settings), cache_settings.deployment) if path else None
    # One round trip per check, with the budget of the cache's exact read; Redis down: fail open.
    return Admission(settings.model_name, quotas, counters, budget_s=cache_settings.store_timeout_ms / 1000,
                     retry_s=cache_settings.degraded_retry_s, fair=fair)


def build_fair_queue(settings: TransformerSettings) -> FairQueue | None:
    """Token-fair admission (--fair-admission) behind the predictor's room, read from its metrics;
    None when it is off."""
    if not settings.fair_admission:
        return None
    url = settings.predictor_metrics_url or metrics_url_of(settings.predictor_host)
    room = Saturation(url, settings.fair_poll_s, settings.fair_max_waiting, settings.fair_max_kv_cache_usage,
                      settings.fair_reserve)
    log.info("fair_admission", predictor_metrics=url, max_waiting=settings.fair_max_waiting,
             max_kv_cache_usage=settings.fair_max_kv_cache_usage, max_wait_s=settings.fair_max_wait_s)
    return FairQueue(settings.model_name, room, settings.fair_max_wait_s)


def assemble(
    settings: TransformerSettings,
    cache_settings: CacheSettings,
    embed_settings: EmbedderSettings,
    verify_settings: VerifierSettings,
) -> Service:
    if settings.workers > 1:
        log.warning("workers_ignored", workers=settings.workers,
                    reason="one process per pod; scale with replicas")
    # First: a bad limits file stops at once.
    admission = build_admission(settings, cache_settings, build_fair_queue(settings))
    auth = Authenticator.from_files(settings.api_keys_file, settings.admin_keys_file, settings.tenant)
    log.info("auth", enabled=auth.enabled)
    predictor = PredictorClient(settings)
    judge = PredictorJudge(predictor) if cache_settings.judge == "predictor" else None
    # --cache-policy off: no cache at all (no Redis connection, every request a bypass).
    cache = (build_cache(cache_settings, embed_settings, verify_settings, judge)
             if settings.cache_policy != "off" else None)  # fmt: skip
    if cache is not None:
        metrics.register_policy(settings.model_name, cache)
    if judge is not None and cache is not None:
        log.info("cache_judge", judge=cache_settings.judge,
                 min_score=cache_settings.judge_min_score, threshold=cache_settings.judge_threshold)
    pipeline = AnswerPipeline(settings, cache, predictor, admission)
    model = SemanticCacheTransformer(settings, pipeline)
    openai: Any = TransformerOpenAI(settings, pipeline)
    request_log = RequestLog.from_settings(settings)
    if request_log.enabled:
        # The pipeline hands it each request's outcome (transformers_svc/request_log.py).
        pipeline.on_outcome = request_log.on_outcome
        log.info("request_log", path=str(settings.request_log), prompt_text=settings.record_prompt_text)
    return Service(
        model=model,
        openai=openai,
        extra_routes=lambda app: register_admin_routes(app, cache, auth),
        inner_layer=(lambda app: HttpAuth(app, auth)) if auth.enabled else None,
        grpc_interceptors=(GrpcAuth(auth),) if auth.enabled else (),
    )
