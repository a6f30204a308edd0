# The workload agent inside a husk container (busybox sh, run as the container's init: pid 1 of its own pid
# namespace). It reads one shell command per line on stdin, evaluates it with stdin from /dev/null and stderr
# merged into stdout, and ends each answer with a line "--end <exit status>". tests/vm/container.py writes the
# commands; processes orphaned by a command are reparented here and reaped by the next external command
# (busybox sh waits with waitpid(-1)).
while IFS= read -r line; do
    eval "$line" </dev/null 2>&1
    rc=$?
    printf '\n--end %d\n' "$rc"
done
