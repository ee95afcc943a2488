"""`semserve tenant rollout | promote | rollback`: a canary of a new model through KServe's
canaryTrafficPercent, with the semantic cache keyed by model revision so that neither revision serves
the other's cached answers. The bookkeeping lives in annotations on the InferenceService, so any
client (or a person with kubectl) sees which revision serves and which one a rollback returns to."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from serverless.kube_client import Client
from serverless.tenant_objects import (
    CACHE_EPOCH_ANN,
    CANARY_PREDICTOR_HOST,
    EPOCH_ENV,
    ISVC_API,
    PREDICTOR_REVISION_ENV,
    PREVIOUS_REVISION_ANN,
    REVISION_ANN,
    REVISION_ENV,
    ROLLOUT_ANN,
    STABLE_PREDICTOR_HOST,
    TAG_ROUTING_ANN,
    TenantError,
    checked_revision,
    default_revision,
    env_value,
    set_env,
    set_predictor_host,
)
from serverless.tenant_status import deployment_mode


def _rollout_target(cl: Client, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(InferenceService, its transformer container) for a rollout command, or TenantError."""
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    if deployment_mode(isvc) != "Knative":
        raise TenantError(
            f"tenant {args.namespace}/{args.name} runs in Standard mode: KServe's canaryTrafficPercent "
            "needs Knative revisions (roll out Standard tenants with a second InferenceService)"
        )
    containers = ((isvc.get("spec") or {}).get("transformer") or {}).get("containers") or []
    if not containers:
        raise TenantError(
            f"tenant {args.namespace}/{args.name} has no transformer container to key the cache"
        )
    return isvc, containers[0]


def _annotations(isvc: dict[str, Any]) -> dict[str, str]:
    return dict((isvc.get("metadata") or {}).get("annotations") or {})


def _patch_isvc(cl: Client, args: argparse.Namespace, patch: dict[str, Any]) -> dict[str, Any]:
    # A merge patch (like wake/sleep): `create` owns the overlay's fields. Lists are replaced whole
    # by a merge patch, so the transformer's containers are sent complete.
    return cl.merge_patch(ISVC_API, "InferenceService", args.namespace, args.name, patch)


def cmd_rollout(cl: Client, args: argparse.Namespace) -> int:
    if not 1 <= args.canary <= 99:
        raise TenantError(f"--canary {args.canary}: a percentage from 1 to 99 (promote gives 100)")
    isvc, container = _rollout_target(cl, args)
    anns = _annotations(isvc)
    if anns.get(ROLLOUT_ANN) == "canary":
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: revision {anns.get(REVISION_ANN)} is still a canary; "
            "`semserve tenant promote` or `semserve tenant rollback` it first"
        )
    spec = isvc["spec"]
    old_model = ((spec.get("predictor") or {}).get("model") or {}).get("storageUri", "")
    # "" only for a tenant created before `create` labelled revisions: its entries carry none.
    old_rev = anns.get(REVISION_ANN) or env_value(container, REVISION_ENV) or ""
    new_rev = checked_revision(args.revision or default_revision(args.model))
    if new_rev == old_rev:
        raise TenantError(f"revision {new_rev} is already the tenant's; give another --model or --revision")
    canary_container = copy.deepcopy(container)
    # The canary transformer keys the cache by the new revision (never reading the old one's
    # entries) and calls only the new predictor revision, so what it stores is the new model's.
    # --share-cache: both revisions read and write one set of entries (a fix that does not change
    # answers, say); the canary then also stores the new model's answers under the old revision.
    label = old_rev if args.share_cache else new_rev
    set_env(canary_container, REVISION_ENV, label)
    set_predictor_host(canary_container, CANARY_PREDICTOR_HOST)
    containers = [canary_container, *spec["transformer"]["containers"][1:]]
    # The canary predictor labels its answers with the new revision (with --share-cache the old
    # one); the previous predictor revision keeps its own label, so each transformer caches only
    # what its own revision's model produced.
    # (Promote and rollback leave the predictor's env alone: changing it would start a new predictor
    # revision, and the labels are already right for the revision that keeps the traffic.)
    predictor_model = copy.deepcopy((spec.get("predictor") or {}).get("model") or {})
    set_env(predictor_model, PREDICTOR_REVISION_ENV, label)
    patch = {
        "metadata": {
            "annotations": {
                REVISION_ANN: new_rev,
                PREVIOUS_REVISION_ANN: old_rev,
                ROLLOUT_ANN: "canary",
                TAG_ROUTING_ANN: "true",
            }
        },
        "spec": {
            "predictor": {
                "canaryTrafficPercent": args.canary,
                "model": {"storageUri": args.model, "env": predictor_model["env"]},
            },
            "transformer": {"canaryTrafficPercent": args.canary, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    key = f"revision {old_rev} (shared, --share-cache)" if args.share_cache else f"revision {new_rev}"
    print(
        f"tenant {args.namespace}/{args.name}: canary of {args.model} as revision {new_rev} at "
        f"{args.canary}% (previous: {old_rev or 'unlabelled'}, {old_model})"
    )
    print(
        f"  predictor    canaryTrafficPercent {args.canary}  storageUri {args.model}  "
        f"answers labelled {label or 'unlabelled'}"
    )
    print(
        f"  transformer  canaryTrafficPercent {args.canary}  cache keyed by {key}, "
        "misses to the latest predictor revision"
    )
    print(
        f"next: `semserve tenant status {args.name} -n {args.namespace}` shows both revisions; then "
        f"`semserve tenant promote {args.name}` or `semserve tenant rollback {args.name}`"
    )
    return 0


def _bump_epoch(container: dict[str, Any], anns: dict[str, str]) -> tuple[int, int]:
    raw = env_value(container, EPOCH_ENV) or anns.get(CACHE_EPOCH_ANN) or "0"
    old = int(raw) if raw.strip().lstrip("-").isdigit() else 0
    set_env(container, EPOCH_ENV, str(old + 1))
    return old, old + 1


def _need_canary(isvc: dict[str, Any], args: argparse.Namespace, verb: str) -> dict[str, str]:
    anns = _annotations(isvc)
    if anns.get(ROLLOUT_ANN) != "canary":
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: no canary to {verb} (rollout "
            f"{anns.get(ROLLOUT_ANN) or 'never started'}); start one with `semserve tenant rollout`"
        )
    return anns


def cmd_promote(cl: Client, args: argparse.Namespace) -> int:
    isvc, container = _rollout_target(cl, args)
    anns = _need_canary(isvc, args, "promote")
    new = copy.deepcopy(container)
    set_predictor_host(new, STABLE_PREDICTOR_HOST)
    # A new epoch: whatever was cached before the promotion (the old model's answers, and those the
    # stable transformer stored from the split predictor during the canary when it had no revision
    # label to compare with) is no longer served.
    old_epoch, epoch = _bump_epoch(new, anns)
    containers = [new, *isvc["spec"]["transformer"]["containers"][1:]]
    patch = {
        "metadata": {"annotations": {ROLLOUT_ANN: "promoted", CACHE_EPOCH_ANN: str(epoch)}},
        # No canaryTrafficPercent: KServe sends 100 % to the latest ready revision.
        "spec": {
            "predictor": {"canaryTrafficPercent": None},
            "transformer": {"canaryTrafficPercent": None, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    rev, prev = anns.get(REVISION_ANN, "?"), anns.get(PREVIOUS_REVISION_ANN, "?")
    print(f"tenant {args.namespace}/{args.name}: promoted revision {rev} to 100% of traffic")
    print(f"  cache epoch {old_epoch} -> {epoch}: answers cached before the promotion are not served")
    if prev:
        print(
            f"  free their memory now with `semserve cache flush --model-revision {prev}` "
            "(else they expire by TTL)"
        )
    else:
        print("  they expire by TTL (the old model's entries carry no revision label to flush by)")
    return 0


def cmd_rollback(cl: Client, args: argparse.Namespace) -> int:
    isvc, container = _rollout_target(cl, args)
    anns = _need_canary(isvc, args, "roll back")
    prev, bad = anns.get(PREVIOUS_REVISION_ANN, ""), anns.get(REVISION_ANN, "")
    new = copy.deepcopy(container)
    set_env(new, REVISION_ENV, prev)
    set_predictor_host(new, STABLE_PREDICTOR_HOST)
    old_epoch, epoch = _bump_epoch(new, anns)
    containers = [new, *isvc["spec"]["transformer"]["containers"][1:]]
    patch = {
        "metadata": {
            "annotations": {
                ROLLOUT_ANN: "rolled-back",
                REVISION_ANN: prev,
                PREVIOUS_REVISION_ANN: bad,
                CACHE_EPOCH_ANN: str(epoch),
            }
        },
        "spec": {
            # 0 %: KServe's rollback, all traffic back on the previous rolled-out predictor revision
            # at once (its pods are still there; restoring the old spec would start new ones).
            "predictor": {"canaryTrafficPercent": 0},
            # The transformer gets a fresh revision keyed by the old model revision, in a new
            # epoch: nothing cached during the canary (by either transformer) is served again.
            "transformer": {"canaryTrafficPercent": None, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    shown = prev or "unlabelled"
    print(f"tenant {args.namespace}/{args.name}: rolled back to revision {shown}; canary {bad} gets 0%")
    print("  predictor    canaryTrafficPercent 0 (previous revision serves 100%)")
    print(f"  transformer  cache keyed by revision {shown}, cache epoch {old_epoch} -> {epoch}")
    print(f"  drop the canary's entries with `semserve cache flush --model-revision {bad}`")
    return 0
