"""`semserve tenant`: create, inspect, wake, sleep, list and delete semserve tenants on a cluster
with KServe (Knative or Standard mode), through the Kubernetes API.

One source of truth: `create` renders the same kustomize overlay that `kubectl apply -k
manifests/overlays/<profile>` deploys and changes only identity (serverless/tenant_objects.py).
Objects are applied with server-side apply (field manager `semserve-tenant`, forcing conflicts: the
repo's overlay owns those fields) through the kubernetes package's DynamicClient
(serverless/kube_client.py). Status is serverless/tenant_status.py, canary rollouts
serverless/rollout.py; this module is the command line.

Errors from the API server (403, 404, 409, webhook rejections) and from the connection or config
are printed as one line, `semserve tenant <cmd>: ...`, with exit status 1; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from semserve.tenant_limits import DEFAULT, FIELDS, LimitsError
from serverless import tenant_limits_config as limits_cm
from serverless.kube_client import Client, connect, describe_error
from serverless.rollout import cmd_promote, cmd_rollback, cmd_rollout
from serverless.tenant_objects import (
    COMPONENTS,
    ISVC_API,
    PROFILE_LABEL,
    PROFILES,
    TENANT_LABEL,
    TenantError,
    dump_objects,
    per_tenant,
    secrets_note,
    tenant_objects,
)
from serverless.tenant_sleep import SleepSettingError, set_sleep
from serverless.tenant_status import conditions, deployment_mode, format_status, tenant_status


def cmd_create(cl: Client | None, args: argparse.Namespace) -> int:
    docs = tenant_objects(
        args.profile,
        args.name,
        args.namespace,
        model=args.model,
        revision=args.revision,
        external_redis=args.external_redis,
    )
    if args.sleep_after_idle_s is not None:
        isvc = next(d for d in docs if d["kind"] == "InferenceService")
        try:
            set_sleep(isvc, args.sleep_after_idle_s)
        except SleepSettingError as e:
            raise TenantError(str(e)) from None
    values = limits_cm.flag_values(args)
    kept = None
    try:
        # The flags alone first: a bad value is refused before any cluster is contacted.
        table = limits_cm.edit_table({}, args.limits_tenant, values)
        if cl is not None:
            # Creating the tenant again (another profile or model) keeps the limits it has; the
            # flags change their entry as `update` would.
            kept = cl.get_or_none("v1", "ConfigMap", args.namespace, limits_cm.configmap_name(args.name))
            if kept is not None:
                table = limits_cm.edit_table(limits_cm.read_table(kept), args.limits_tenant, values)
        limits_cm.set_limits(docs, table)
    except LimitsError as e:
        raise TenantError(str(e)) from None
    if args.dry_run:
        print(secrets_note(docs, args.namespace), end="")
        print(dump_objects(docs), end="")
        return 0
    assert cl is not None
    # Admission first for every object (dryRun=All), so a rejected InferenceService leaves no
    # half-applied tenant behind; then the real apply.
    for doc in docs:
        cl.apply(doc, dry_run=True)
    if args.server_dry_run:
        print(f"{len(docs)} objects pass server-side dry run")
        return 0
    for doc in docs:
        cl.apply(doc)
        print(f"{doc['kind']}/{doc['metadata']['name']} applied")
    if kept is not None:
        print(f"limits kept from the tenant's ConfigMap (`semserve tenant update` changes them):\n"
              f"{limits_cm.describe(table)}")  # fmt: skip
    print(
        f"tenant {args.namespace}/{args.name} ({args.profile}): `semserve tenant status {args.name} "
        f"-n {args.namespace}` shows when it is ready"
    )
    return 0


def cmd_update(cl: Client, args: argparse.Namespace) -> int:
    """Change the tenant's limits, and nothing else: its limits ConfigMap, server-side applied."""
    values = limits_cm.flag_values(args)
    if args.remove == any(v is not None for v in values.values()):
        raise TenantError(
            "give the limits to set (" + ", ".join(limits_cm.flag(f) for f in FIELDS) + ") or --remove"
        )
    name = limits_cm.configmap_name(args.name)
    current = cl.get_or_none("v1", "ConfigMap", args.namespace, name)
    if current is None:
        raise TenantError(
            f"tenant {args.namespace}/{args.name} has no ConfigMap {name} (created before tenant "
            "limits existed?): `semserve tenant create` it again with its profile and the limit flags"
        )
    try:
        table = limits_cm.edit_table(
            limits_cm.read_table(current), args.limits_tenant, values, remove=args.remove
        )
    except LimitsError as e:
        raise TenantError(str(e)) from None
    meta = current.get("metadata") or {}
    # The object as `create` applied it (same field manager), with only limits.json changed.
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": args.namespace, "labels": meta.get("labels") or {}},
        "data": {**(current.get("data") or {}), limits_cm.LIMITS_KEY: limits_cm.limits_json(table)},
    }
    cl.apply(doc, dry_run=True)
    if args.server_dry_run:
        print(f"ConfigMap/{name} passes server-side dry run:\n{limits_cm.describe(table)}")
        return 0
    cl.apply(doc)
    print(f"ConfigMap/{name} applied:\n{limits_cm.describe(table)}")
    print("running transformers read it within about a minute (the kubelet's ConfigMap sync), no restart")
    return 0


def cmd_status(cl: Client, args: argparse.Namespace) -> int:
    st = tenant_status(cl, args.namespace, args.name)
    print(json.dumps(st, indent=2) if args.json else format_status(st))
    return 0


def cmd_list(cl: Client, args: argparse.Namespace) -> int:
    ns = None if args.all_namespaces else args.namespace
    items = cl.list(ISVC_API, "InferenceService", ns, selector=TENANT_LABEL)
    print(f"{'NAMESPACE':<20} {'NAME':<24} {'PROFILE':<10} {'READY':<8} URL")
    for isvc in items:
        meta = isvc.get("metadata") or {}
        ready = (conditions(isvc).get("Ready") or {}).get("status", "Unknown")
        print(
            f"{meta.get('namespace', ''):<20} {meta.get('name', ''):<24} "
            f"{(meta.get('labels') or {}).get(PROFILE_LABEL, ''):<10} {ready:<8} "
            f"{(isvc.get('status') or {}).get('url', '') or '-'}"
        )
    return 0


def _set_min_replicas(cl: Client, namespace: str, name: str, values: dict[str, int]) -> None:
    # A merge patch, not an apply: `create` owns the overlay's fields, this only moves minReplicas
    # (KServe turns it into the revision's min-scale, which Knative honours by starting pods now).
    cl.merge_patch(
        ISVC_API,
        "InferenceService",
        namespace,
        name,
        {"spec": {c: {"minReplicas": v} for c, v in values.items()}},
    )


def cmd_wake(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    spec = isvc.get("spec") or {}
    values = {c: 1 for c in COMPONENTS if c in spec and int(spec[c].get("minReplicas", 1)) < 1}
    if not values:
        print(f"tenant {args.namespace}/{args.name}: already kept warm (minReplicas >= 1)")
    else:
        _set_min_replicas(cl, args.namespace, args.name, values)
        print(
            f"tenant {args.namespace}/{args.name}: minReplicas 1 for {', '.join(values)}; "
            "pods start now (`semserve tenant sleep` lets them go again)"
        )
    return _wait(cl, args, lambda c: (c["actual"] or 0) >= 1, "ready pods")


def cmd_sleep(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    if deployment_mode(isvc) != "Knative":
        raise TenantError(
            f"tenant {args.namespace}/{args.name} runs in Standard mode, which cannot scale "
            "to zero (no activator); use a Knative profile"
        )
    profile = ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, "")
    # Back to what the profile deploys; only dev profiles go to zero unless forced.
    rendered = tenant_objects(profile, args.name, args.namespace) if profile in PROFILES else []
    target = next((d for d in rendered if d["kind"] == "InferenceService"), {}).get("spec", {})
    values = {}
    for c in COMPONENTS:
        if c not in (isvc.get("spec") or {}):
            continue
        want = 0 if args.force else int((target.get(c) or {}).get("minReplicas", 0))
        values[c] = want
    if any(v > 0 for v in values.values()):
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: profile {profile} keeps "
            f"minReplicas {values}; --force takes it to zero anyway"
        )
    _set_min_replicas(cl, args.namespace, args.name, values)
    print(
        f"tenant {args.namespace}/{args.name}: minReplicas 0; pods go after the stable window with no "
        "traffic plus the retention period"
    )
    return _wait(cl, args, lambda c: c["scaled_to_zero"], "scale to zero")


def _wait(cl: Client, args: argparse.Namespace, done: Any, what: str) -> int:
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        st = tenant_status(cl, args.namespace, args.name)
        if all(done(c) for c in st["components"]):
            print(format_status(st))
            return 0
        if time.monotonic() > deadline:
            print(format_status(st))
            raise TenantError(f"timed out after {args.wait:g}s waiting for {what}")
        time.sleep(min(2.0, args.wait / 10))


def cmd_delete(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    profile = ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, "dev")
    docs = tenant_objects(profile if profile in PROFILES else "dev", args.name, args.namespace)
    for doc in docs:
        shared = not per_tenant(doc)
        if shared and not args.shared:
            continue
        gone = cl.delete(doc["apiVersion"], doc["kind"], args.namespace, doc["metadata"]["name"])
        print(f"{doc['kind']}/{doc['metadata']['name']} {'deleted' if gone else 'not found'}")
    if not args.shared:
        print("shared objects (Redis, policies, monitors) kept; --shared deletes them too")
    return 0


COMMANDS = {
    "create": cmd_create,
    "update": cmd_update,
    "status": cmd_status,
    "list": cmd_list,
    "wake": cmd_wake,
    "sleep": cmd_sleep,
    "delete": cmd_delete,
    "rollout": cmd_rollout,
    "promote": cmd_promote,
    "rollback": cmd_rollback,
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tenant",
        help="create and manage semserve tenants on KServe/Knative",
        description=__doc__.splitlines()[0],
    )
    ts = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser, name: bool = True) -> None:
        if name:
            q.add_argument("name", help="tenant = InferenceService name")
        q.add_argument("-n", "--namespace", default="default")
        q.add_argument(
            "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
        )
        q.add_argument("--context", default=None, help="kubeconfig context")

    c = ts.add_parser("create", help="render the profile's overlay and server-side apply it")
    common(c)
    c.add_argument("--profile", default="dev", choices=list(PROFILES))
    c.add_argument("--model", default=None, help="predictor storageUri (hf://..., pvc://claim/dir, s3://...)")
    c.add_argument(
        "--revision",
        default=None,
        help="model revision label (cache key, answer label); default: derived from the storageUri",
    )
    c.add_argument(
        "--external-redis",
        action="store_true",
        help="leave out the in-cluster Redis (the Secret semserve-redis points at yours)",
    )
    c.add_argument(
        "--sleep-after-idle-s",
        type=str,
        default=None,
        metavar="SECONDS",
        help="GPU predictors: sleep (vLLM sleep mode) after this many idle seconds, wake on the next "
        "request; annotation semserve.io/sleep-after-idle-s. Refused on CPU profiles (no sleep mode)",
    )
    limit_flags(c)
    c.add_argument("--dry-run", action="store_true", help="print the objects; contact no cluster")
    c.add_argument("--server-dry-run", action="store_true", help="apply with dryRun=All (admission runs)")
    u = ts.add_parser(
        "update",
        help="change the tenant's limits (its NAME-tenant-limits ConfigMap only; no restart)",
    )
    common(u)
    limit_flags(u, update=True)
    u.add_argument("--remove", action="store_true", help="drop the --limits-tenant entry")
    u.add_argument("--server-dry-run", action="store_true", help="apply with dryRun=All (admission runs)")
    s = ts.add_parser("status", help="readiness, URL, revision, desired/actual replicas per component")
    common(s)
    s.add_argument("--json", action="store_true")
    lp = ts.add_parser("list", help="tenants in a namespace (or all)")
    common(lp, name=False)
    lp.add_argument("-A", "--all-namespaces", action="store_true")
    for verb, text in (("wake", "pre-warm: scale from zero now"), ("sleep", "back to zero")):
        w = ts.add_parser(verb, help=text)
        common(w)
        w.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait until done")
        if verb == "sleep":
            w.add_argument("--force", action="store_true", help="to zero even if the profile keeps pods")
    r = ts.add_parser("rollout", help="start a canary of a new model (KServe canaryTrafficPercent)")
    common(r)
    r.add_argument("--model", required=True, help="the new predictor storageUri")
    r.add_argument("--canary", type=int, default=10, metavar="PERCENT", help="traffic to the new revision")
    r.add_argument(
        "--revision",
        default=None,
        help="model revision label for the cache key (default: from the storageUri)",
    )
    r.add_argument(
        "--share-cache",
        action="store_true",
        help="let the canary read and write the old revision's cache entries",
    )
    for verb, text in (
        ("promote", "send 100%% to the canary and bump the cache epoch"),
        ("rollback", "send 100%% back to the previous revision and bump the cache epoch"),
    ):
        common(ts.add_parser(verb, help=text))
    d = ts.add_parser("delete", help="delete the tenant's InferenceService (and PDBs)")
    common(d)
    d.add_argument("--shared", action="store_true", help="also the namespace's shared objects (Redis, ...)")
    p.set_defaults(func=run)


def limit_flags(q: argparse.ArgumentParser, update: bool = False) -> None:
    """The tenant limits as flags: the fields of the --tenant-limits-file entry they set."""
    q.add_argument(
        "--limits-tenant",
        default=DEFAULT,
        metavar="TENANT",
        help="the entry the limit flags set: an API-key tenant of this InferenceService, or "
        '"default" (every tenant without an entry of its own; the one tenant when auth is off)',
    )
    helps = {
        "requests_per_minute": "requests per minute, cache hits included (429 over it)",
        "tokens_per_minute": "prompt + completion tokens per minute of predictor generations",
        "max_concurrent": "misses in flight at the predictor",
        "weight": "share of the predictor when tenants compete (default 1)",
    }
    lift = f"; {limits_cm.NO_LIMIT} lifts it" if update else ""
    for field in FIELDS:
        q.add_argument(
            limits_cm.flag(field),
            dest=field,
            default=None,
            metavar="N",
            help=helps[field] + lift,
        )


def run(args: argparse.Namespace) -> int:
    try:
        needs_cluster = not (args.tenant_command == "create" and args.dry_run)
        cl = connect(args.kubeconfig, args.context) if needs_cluster else None
        return COMMANDS[args.tenant_command](cl, args)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # every failure is one line, never a traceback
        line = str(e) if isinstance(e, TenantError) else describe_error(e)
        print(f"semserve tenant {args.tenant_command}: {line}", file=sys.stderr)
        return 1
