"""Spec options for the container process: args, env, working dir, terminal, user, oom_score_adj."""
from __future__ import annotations

from cri_server.api.v1 import api_pb2 as pb
from cri_server.spec import users
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def with_process_args(spec: Spec, ctx: ContainerContext) -> None:
    """command replaces the image's entrypoint, args its cmd; args without a command keep the entrypoint; a
    command without args drops the image's cmd (Docker's rules, as kubelet documents them)."""
    command, args = list(ctx.config.command), list(ctx.config.args)
    if not command:
        if not args:
            args = list(ctx.image.cmd)
        if not (len(ctx.image.entrypoint) == 1 and ctx.image.entrypoint[0] == ""):
            command = list(ctx.image.entrypoint)
    if not command and not args:
        raise invalid("config.command", "no command specified, and the image has no entrypoint or cmd")
    ensure(spec, "process")["args"] = command + args


def merge_env(*layers: list[str] | tuple[str, ...]) -> list[str]:
    """Later layers replace earlier values of the same name; order of first appearance is kept."""
    out: dict[str, str] = {}
    for layer in layers:
        for kv in layer:
            name = kv.split("=", 1)[0]
            out[name] = kv
    return list(out.values())


def with_env(spec: Spec, ctx: ContainerContext) -> None:
    cri = []
    for i, kv in enumerate(ctx.config.envs):
        if not kv.key:
            raise invalid(f"config.envs[{i}].key", "must not be empty")
        if "=" in kv.key:
            raise invalid(f"config.envs[{i}].key", f"{kv.key!r} contains '='")
        cri.append(f"{kv.key}={kv.value.decode('utf-8', 'surrogateescape')}")
    base = [DEFAULT_PATH]
    if ctx.sandbox.hostname:
        base.append(f"HOSTNAME={ctx.sandbox.hostname}")
    if ctx.config.tty:
        base.append("TERM=xterm")
    ensure(spec, "process")["env"] = merge_env(base, ctx.image.env, cri)


def with_cwd(spec: Spec, ctx: ContainerContext) -> None:
    cwd = ctx.config.working_dir or ctx.image.working_dir or "/"
    if not cwd.startswith("/"):
        raise invalid("config.working_dir", f"{cwd!r} must be an absolute path")
    ensure(spec, "process")["cwd"] = cwd


def with_terminal(spec: Spec, ctx: ContainerContext) -> None:
    ensure(spec, "process")["terminal"] = bool(ctx.config.tty)


def _user_fields(spec: Spec, resolved: users.ResolvedUser) -> None:
    user = {"uid": resolved.uid, "gid": resolved.gid}
    if resolved.additional_gids:
        user["additionalGids"] = list(resolved.additional_gids)
    ensure(spec, "process")["user"] = user


def with_user(spec: Spec, ctx: ContainerContext) -> None:
    """run_as_username, else run_as_user, else the image's USER; run_as_group needs one of the first two.
    Supplemental groups: the image's /etc/group memberships (policy Merge) plus supplemental_groups."""
    sc = ctx.config.linux.security_context
    has_uid = sc.HasField("run_as_user")
    if sc.HasField("run_as_group") and not has_uid and not sc.run_as_username:
        raise invalid("config.linux.security_context.run_as_group",
                      "requires run_as_user or run_as_username")
    if has_uid and sc.run_as_user.value < 0:
        raise invalid("config.linux.security_context.run_as_user", "must not be negative")
    gid = sc.run_as_group.value if sc.HasField("run_as_group") else None
    if gid is not None and gid < 0:
        raise invalid("config.linux.security_context.run_as_group", "must not be negative")
    merge = sc.supplemental_groups_policy != pb.Strict
    try:
        if sc.run_as_username:
            resolved = users.resolve(ctx.rootfs, user=sc.run_as_username, gid=gid,
                                     extra_groups=tuple(sc.supplemental_groups), merge_image_groups=merge)
        elif has_uid:
            resolved = users.resolve(ctx.rootfs, uid=sc.run_as_user.value, gid=gid,
                                     extra_groups=tuple(sc.supplemental_groups), merge_image_groups=merge)
        else:
            resolved = users.resolve(ctx.rootfs, user=ctx.image.user, gid=gid,
                                     extra_groups=tuple(sc.supplemental_groups), merge_image_groups=merge)
    except users.UserError as e:
        raise invalid("config.linux.security_context", str(e)) from None
    _user_fields(spec, resolved)


def with_rlimits(spec: Spec, ctx: ContainerContext | SandboxContext) -> None:
    n = ctx.host.nofile_limit
    ensure(spec, "process")["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": n, "soft": n}]


def with_oom_score_adj(spec: Spec, ctx: ContainerContext) -> None:
    adj = ctx.config.linux.resources.oom_score_adj
    ensure(spec, "process")["oomScoreAdj"] = ctx.host.oom.clamp(adj, ctx.id)


# --- the sandbox (pause) process -------------------------------------------------------------

def with_sandbox_process(spec: Spec, ctx: SandboxContext) -> None:
    args = list(ctx.image.entrypoint) + list(ctx.image.cmd)
    if not args:
        raise invalid("sandbox image", f"{ctx.image_name or 'the sandbox image'} has no entrypoint or cmd")
    p = ensure(spec, "process")
    p["args"] = args
    p["env"] = merge_env([DEFAULT_PATH], ctx.image.env)
    p["cwd"] = ctx.image.working_dir or "/"
    p["terminal"] = False


def with_sandbox_user(spec: Spec, ctx: SandboxContext) -> None:
    sc = ctx.config.linux.security_context
    if sc.HasField("run_as_group") and not sc.HasField("run_as_user"):
        raise invalid("config.linux.security_context.run_as_group", "requires run_as_user")
    uid = sc.run_as_user.value if sc.HasField("run_as_user") else None
    gid = sc.run_as_group.value if sc.HasField("run_as_group") else None
    try:
        resolved = users.resolve(ctx.rootfs, user=ctx.image.user, uid=uid, gid=gid,
                                 extra_groups=tuple(sc.supplemental_groups))
    except users.UserError as e:
        raise invalid("sandbox image user", str(e)) from None
    _user_fields(spec, resolved)


# kubelet's -998 for sandboxes (containerd's defaultSandboxOOMAdj)
SANDBOX_OOM_SCORE_ADJ = -998


def with_sandbox_oom_score_adj(spec: Spec, ctx: SandboxContext) -> None:
    ensure(spec, "process")["oomScoreAdj"] = ctx.host.oom.clamp(SANDBOX_OOM_SCORE_ADJ, ctx.id)
