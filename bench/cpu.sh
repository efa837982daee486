# bench/cpu.sh: where the machine's CPU went during a measure, by part:
# what the business runs (its backends, pgbench, the server's own
# processes) and what capturing its events runs (the relay, the Kafka
# broker, Debezium's walsender and Kafka Connect).  On a machine whose
# cores the business fills, every CPU second a capturer takes is one the
# business does not get: this is the profile behind bench/enqueue's ratios.
# Source it after test/cluster.sh (CLUSTER_DATA); KAFKA_PID and
# DEBEZIUM_PID name the JVMs when they run.
#
# Read from /proc, in clock ticks: each process's utime + stime, and the
# postmaster's cutime + cstime, which holds every child it has reaped (a
# backend that ended with its pgbench client, an autovacuum worker).  The
# script's own cutime + cstime holds pgbench once it has ended.

# cpu_snap FILE: one line per part, "PART TICKS", and "total TICKS",
# "idle TICKS" and "steal TICKS" (what the host of a virtual machine took)
# from /proc/stat, written to FILE.
cpu_snap() {
    local pm line pid kind
    pm=$(head -1 "$CLUSTER_DATA/postmaster.pid")
    {
        awk '/^cpu / {print "total", $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; print "idle", $5 + $6; print "steal", $9}' /proc/stat
        cpu_ticks "$pm" | awk '{print "server", $1; print "reaped", $2}'
        cpu_ticks $$ | awk '{print "client", $2}'
        [ -n "${KAFKA_PID:-}" ] && cpu_ticks "$KAFKA_PID" | awk '{print "broker", $1}'
        [ -n "${DEBEZIUM_PID:-}" ] && cpu_ticks "$DEBEZIUM_PID" | awk '{print "connect", $1}'
        for pid in $(pgrep -P "$pm"); do
            line=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
            case $line in
            *"outbox relay"*) kind=relay ;;
            *walsender* | *"wal sender"*) kind=walsender ;;
            *"outbox launcher"* | *writer* | *checkpointer* | *launcher* | *archiver* | *collector*) kind=server ;;
            *) kind=backends ;;
            esac
            cpu_ticks "$pid" | awk -v k="$kind" -v p="$pid" '{print k, $1, p}'
        done
    } >"$1"
}

# cpu_ticks PID: "OWN REAPED" clock ticks of PID (utime + stime, cutime +
# cstime); nothing if it has ended.  The command name, in parentheses, may
# hold spaces: the fields are counted after its closing one.
cpu_ticks() {
    sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12 + $13, $14 + $15}'
}

# CPU_PARTS: the columns cpu_share prints, in order.
CPU_PARTS="busy backends client server relay broker walsender connect steal other business_us capture_us"

# cpu_share BEFORE AFTER TXNS: the CPU_PARTS between the two snapshots,
# one line: each part's share of the machine's CPU (percent; busy is their
# sum, other what no part names, the kernel's threads included), then the CPU microseconds per transaction of the business (its
# backends, pgbench, the server's processes) and of the capturers (relay,
# broker, walsender, Connect).  A child of the postmaster that ended
# meanwhile counts through "reaped", as a backend; one that began counts
# from zero.
cpu_share() {
    awk -v txns="$3" -v hz="$(getconf CLK_TCK)" -v parts="$CPU_PARTS" '
        FNR == 1 { file++ }
        {
            key = ($3 != "") ? $1 " " $3 : $1
            if (file == 1) { before[key] = $2; next }
            part = ($1 == "reaped") ? "backends" : $1
            t[part] += $2 - ((key in before) ? before[key] : 0)
        }
        END {
            n = split(parts, p, " ")
            t["busy"] = t["total"] - t["idle"]
            t["other"] = t["busy"]
            for (i = 2; i <= 9; i++) t["other"] -= t[p[i]]
            for (i = 1; i <= 10; i++) printf "%.1f ", 100 * t[p[i]] / t["total"]
            us = 1e6 / hz / txns
            printf "%.0f %.0f\n", (t["backends"] + t["client"] + t["server"]) * us,
                (t["relay"] + t["broker"] + t["walsender"] + t["connect"]) * us
        }' "$1" "$2"
}
