# Sourced by scripts/bench/{cri,relist,runtime}: husk installed non-editable and byte-compiled into a temp venv
# (PYTHONDONTWRITEBYTECODE=1 would otherwise make every husk-cri, shim and runtime start recompile the project),
# with the fast launcher, and the teardown of what a run as root leaves in it.

# bench_venv WORK TOP [PIP_PACKAGE...]: WORK/venv with husk from TOP (and the extra packages), WORK/venv/bin/husk.
bench_venv() {
    local work=$1 top=$2
    shift 2
    "$("$top/scripts/venv-python")" -m venv "$work/venv"
    "$work/venv/bin/pip" install -q "$top" "$@" >/dev/null 2>&1
    "$work/venv/bin/python" -m compileall -q "$work/venv/lib" >/dev/null
    # -I: not the caller's directory first on sys.path (run from a checkout, `-m` found the checkout's runtime
    # package and the launcher named the checkout instead of the installed, byte-compiled copy)
    "$work/venv/bin/python" -I -m runtime.launcher "$work/venv/bin/husk"
}

# venv_unmount WORK: the mounts below WORK (the venv's persistent protected interpreter and its directory,
# made by the first `husk` call as root: runtime/exeguard.py), deepest first, so that WORK can be removed.
venv_unmount() {
    awk -v w="$1/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}
