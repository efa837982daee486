# test/chaos/writers.sh: the order writers (test/tools/chaos_writer.c) of
# the chaos suite and the partition suite: started, stopped, and what they
# saw acknowledged.  Needs W (the run's directory), WRITERS, TOPIC and a
# function conninfo DB.  WRITER_RUN is a command prefix that runs each
# writer (the partition suite's enters the clients' network namespace; it
# must exec the writer, so that $! is the writer's own process); WRITER_ARGS
# are more of the writer's options.

WRITER_PIDS=()
WRITER_RUN=()
WRITER_ARGS=()

chaos_start_writers() {
    local w
    for w in $(seq 1 "$WRITERS"); do
        "${WRITER_RUN[@]}" "$TOOLS/outbox-chaos-writer" -d "$(conninfo shop)" -w "$w" -t "$TOPIC" \
            "${WRITER_ARGS[@]}" >"$W/acked.$w" 2>"$W/writer.$w.log" &
        WRITER_PIDS+=($!)
    done
}

chaos_stop_writers() {
    [ ${#WRITER_PIDS[@]} -gt 0 ] || return 0
    kill -TERM "${WRITER_PIDS[@]}" 2>/dev/null
    wait "${WRITER_PIDS[@]}" 2>/dev/null
    WRITER_PIDS=()
}

# acked: orders the writers have seen committed so far.
acked() {
    cat "$W"/acked.* | wc -l
}
