# Stage 2, PID 1 of the guest on the switched root (the host's tree under an overlay): runs the job the host
# wrote (/run/husk-vm/job/run), writes its exit status next to it, and powers the guest off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp TMPDIR=/tmp PYTHONDONTWRITEBYTECODE=1 HUSK_VM=1 LANG=C.UTF-8
bb=/run/husk-vm/busybox
job=/run/husk-vm/job

read -r up _ < /proc/uptime
echo "husk-vm: booted in ${up}s (guest uptime at stage 2)"
echo "$up" > "$job/boot-seconds"

/bin/sh "$job/run" < /dev/null
rc=$?
echo "$rc" > "$job/exit-code.tmp" && $bb mv "$job/exit-code.tmp" "$job/exit-code"
$bb sync
$bb umount "$job" 2>/dev/null
echo "husk-vm: job exit status $rc"
$bb poweroff -f
