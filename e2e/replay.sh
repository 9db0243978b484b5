#!/usr/bin/env bash
# Replay a live run with the stock nats CLI, exactly as the README shows it,
# and check what each command prints.
#
# It starts `pal dev` in a temporary data directory on free loopback ports,
# saves the nats context for pal dev's own client user with the line pal
# dev prints (in a temporary nats config home): a user of the client
# account, which reaches PAL only through its imports (first without
# --select, naming the context with --context, as the README offers). It runs
# examples/hello.json to the end, then runs the README's commands, as
# written, with that context (no flag: the imports keep the JetStream
# API's subjects, and a consumer the client makes, through PAL's guard,
# delivers to its own inbox):
#
#   nats sub --stream PAL_EVENTS --all -T 'pal.events.<run_id>'
#   nats stream get PAL_EVENTS --last-for 'pal.events.<run_id>'
#   nats kv watch PAL_LEASES
#   nats micro ls
#   nats req pal.api.runs.get '{"run_id":"<run_id>"}'
#   nats req pal.api.workflows.list ''
#   nats req pal.api.runs.start '{"workflow":"hello","input":{"text":"over NATS"}}'
#
# and checks the client cannot write the journal (nats pub pal.events.…)
# nor start an inline definition,
# that a durable command it publishes on pal.cmd.runs.start.client starts
# a run as that user, and that a responder it aims at the journal with
# its reply subject (nats pub --reply pal.events.<run> to the JetStream
# API and the service's discovery) changes nothing.
#
# Usage: PAL=bin/pal NATS=bin/nats bash e2e/replay.sh   (make e2e does this)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
PAL=${PAL:-$root/bin/pal}
NATS=${NATS:-$root/bin/nats}
for bin in "$PAL" "$NATS"; do
	[[ -x $bin ]] || { echo "e2e: $bin is missing (run make e2e)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/pal-e2e.XXXXXX")
dev_pid=""
cleanup() {
	local status=$?
	if [[ -n $dev_pid ]] && kill -0 "$dev_pid" 2>/dev/null; then
		kill -TERM "$dev_pid" 2>/dev/null || true
		wait "$dev_pid" 2>/dev/null || true
	fi
	if [[ $status -ne 0 && -f $work/dev.log ]]; then
		echo "--- pal dev output" >&2
		tail -n 50 "$work/dev.log" >&2
	fi
	rm -rf "$work"
	exit "$status"
}
trap cleanup EXIT

fail() {
	echo "e2e: FAIL: $*" >&2
	exit 1
}

# free_port prints a TCP port on 127.0.0.1 that nothing listens on.
free_port() {
	local port
	for _ in $(seq 1 100); do
		port=$((20000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	fail "no free port found"
}

nats_port=$(free_port)
http_port=$(free_port)
while [[ $http_port == "$nats_port" ]]; do http_port=$(free_port); done
export PAL_NATS_URL="nats://127.0.0.1:$nats_port"
export PAL_HTTP_ADDR="127.0.0.1:$http_port"
unset DATABASE_URL PAL_API_TOKENS NATS_CONTEXT PAL_NATS_CREDS PAL_HOME PAL_DATA_DIR
# The nats CLI keeps its contexts here, not in the user's.
export XDG_CONFIG_HOME=$work/config

# Every nats command uses the selected context: the one pal dev's line saves.
nats() { "$NATS" "$@" </dev/null; }

echo "e2e: starting pal dev (NATS $PAL_NATS_URL, REST $PAL_HTTP_ADDR, data in $work/data)"
"$PAL" dev --data-dir "$work/data" >"$work/dev.log" 2>&1 &
dev_pid=$!
for i in $(seq 1 600); do
	grep -q "Press Ctrl-C" "$work/dev.log" && break
	kill -0 "$dev_pid" 2>/dev/null || fail "pal dev exited"
	[[ $i -lt 600 ]] || fail "pal dev was not ready after 60s"
	sleep 0.1
done
save=$(grep -oE "nats context save .*--select" "$work/dev.log") || fail "pal dev printed no nats context save line"
# The README's form that leaves the user's default context alone: the
# same line without --select, and --context pal-dev on each command.
keep=${save% --select}
echo "e2e: $keep; nats --context pal-dev micro ls"
eval "\"\$NATS\" ${keep#nats }" >/dev/null || fail "nats context save (without --select) failed"
"$NATS" --context pal-dev micro ls </dev/null 2>/dev/null | grep ' pal ' >/dev/null || fail "nats --context pal-dev micro ls does not list pal"
echo "e2e: $save"
eval "\"\$NATS\" ${save#nats }" >/dev/null || fail "nats context save failed"
nats stream info PAL_EVENTS >/dev/null 2>&1 || fail "the client role cannot read PAL_EVENTS' info"
nats micro ls 2>/dev/null | grep ' pal ' >/dev/null || fail "nats micro ls does not list pal"

# The pal commands read pal dev's dev.env (the worker role's credentials).
export PAL_HOME=$work/data
run_id=$(cd "$root" && "$PAL" run start --workflow examples/hello.json --input '{"text":"PAL journals every step"}' --wait 2>"$work/start.log") ||
	{ cat "$work/start.log" >&2; fail "the run did not succeed"; }
[[ $run_id =~ ^[A-Za-z0-9_-]+$ ]] || fail "pal run start printed no run id: $run_id"
last_seq=$("$PAL" run get "$run_id" --json | grep -o '"last_seq":[0-9]*' | cut -d: -f2)
[[ $last_seq -ge 3 ]] || fail "run $run_id has last_seq '$last_seq'"
echo "e2e: run $run_id succeeded with $last_seq events"

# The journal as pal itself reads it: "seq kind" per line.
"$PAL" run events "$run_id" --json |
	sed -E 's/^\{"v":1,"run_id":"[^"]+","seq":([0-9]+),"kind":"([a-z_]+)".*/\1 \2/' >"$work/want"
[[ $(wc -l <"$work/want") -eq $last_seq ]] || fail "pal run events printed $(wc -l <"$work/want") events, want $last_seq"

# 1. The whole run, then exit (-T ends at the end of what the stream holds).
echo "e2e: nats sub --stream PAL_EVENTS --all -T 'pal.events.$run_id'"
timeout 60 "$NATS" sub --stream PAL_EVENTS --all -T "pal.events.$run_id" </dev/null >"$work/sub" 2>&1 ||
	{ cat "$work/sub" >&2; fail "nats sub -T did not exit by itself with status 0"; }
grep -E '^\{"v":1,' "$work/sub" |
	sed -E 's/^\{"v":1,"run_id":"([^"]+)","seq":([0-9]+),"kind":"([a-z_]+)".*/\1 \2 \3/' >"$work/sub.events"
awk -v id="$run_id" '$1 != id { exit 1 }' "$work/sub.events" || fail "nats sub printed events of another run"
cut -d' ' -f2- "$work/sub.events" >"$work/got"
awk -v n="$last_seq" '$1 != NR { exit 1 } END { if (NR != n) exit 1 }' "$work/got" ||
	{ cat "$work/got" >&2; fail "nats sub: want every seq 1..$last_seq exactly once, in order"; }
diff -u "$work/want" "$work/got" >&2 || fail "nats sub and pal run events disagree"
grep '^Pal-Kind: ' "$work/sub" | cut -d' ' -f2 >"$work/kinds"
cut -d' ' -f2 "$work/got" | diff -u - "$work/kinds" >&2 || fail "a Pal-Kind header differs from its event's kind"
[[ $(tail -n 1 "$work/got") == "$last_seq run_succeeded" ]] || fail "the last event is not run_succeeded"
[[ $(grep -c "Received JetStream message" "$work/sub") -eq $last_seq ]] || fail "nats sub received other than $last_seq messages"

# 2. The run's last event.
echo "e2e: nats stream get PAL_EVENTS --last-for 'pal.events.$run_id'"
nats stream get PAL_EVENTS --last-for "pal.events.$run_id" >"$work/get" 2>&1 || { cat "$work/get" >&2; fail "nats stream get failed"; }
grep -q "Pal-Kind: run_succeeded" "$work/get" || fail "nats stream get: no Pal-Kind: run_succeeded header"
grep -q "Nats-Msg-Id: $run_id:$last_seq" "$work/get" || fail "nats stream get: no Nats-Msg-Id $run_id:$last_seq"
grep -qE "^\{\"v\":1,\"run_id\":\"$run_id\",\"seq\":$last_seq,\"kind\":\"run_succeeded\"" "$work/get" ||
	fail "nats stream get: the envelope is not seq $last_seq run_succeeded"

# 3. Leases: the run's lease was released when it ended. kv watch runs
# until stopped: bounded here.
echo "e2e: nats kv watch PAL_LEASES (for 3s)"
set +e
timeout 3 "$NATS" kv watch PAL_LEASES </dev/null >"$work/kv" 2>&1
status=$?
set -e
[[ $status -eq 124 ]] || { cat "$work/kv" >&2; fail "nats kv watch exited with status $status, want it running until stopped"; }
grep -qE "(PURGE|DEL) PAL_LEASES > $run_id" "$work/kv" || { cat "$work/kv" >&2; fail "nats kv watch: no released lease for $run_id"; }

# 4. The NATS micro service.
echo "e2e: nats micro ls"
nats micro ls >"$work/micro" 2>&1 || fail "nats micro ls failed"
grep -qE '│ pal +│ [0-9]+\.[0-9]+\.[0-9]+ ' "$work/micro" || { cat "$work/micro" >&2; fail "nats micro ls does not list the service pal"; }

# 5. Request/reply on the service.
echo "e2e: nats req pal.api.runs.get '{\"run_id\":\"$run_id\"}'"
nats req pal.api.runs.get "{\"run_id\":\"$run_id\"}" >"$work/req" 2>"$work/req.err" || { cat "$work/req.err" >&2; fail "nats req failed"; }
grep -q "\"run_id\":\"$run_id\",\"status\":\"succeeded\"" "$work/req" || { cat "$work/req" >&2; fail "nats req: the run is not succeeded"; }
grep -q "\"last_seq\":$last_seq," "$work/req" || fail "nats req: last_seq is not $last_seq"
nats req pal.api.runs.get '{"run_id":"pal.events.>"}' >"$work/bad" 2>&1 || true
grep -q '"code":"bad_input"' "$work/bad" || { cat "$work/bad" >&2; fail "nats req with a subject-widening run id was not refused"; }

# 6. The deployed workflows (pal run start --workflow deployed hello), and
# a start by name; a definition is refused: the client user has no scope
# deploy, so it starts deployed workflows only.
echo "e2e: nats req pal.api.workflows.list ''"
nats req pal.api.workflows.list '' >"$work/wfs" 2>"$work/wfs.err" || { cat "$work/wfs.err" >&2; fail "nats req pal.api.workflows.list failed"; }
grep -q '"name":"hello","version":1,' "$work/wfs" || { cat "$work/wfs" >&2; fail "nats req: hello@1 is not deployed"; }
echo "e2e: nats req pal.api.runs.start '{\"workflow\":\"hello\",\"input\":{\"text\":\"over NATS\"}}'"
nats req pal.api.runs.start '{"workflow":"hello","input":{"text":"over NATS"}}' >"$work/start" 2>"$work/start.err" ||
	{ cat "$work/start.err" >&2; fail "nats req pal.api.runs.start failed"; }
by_name=$(grep -oE '"run_id":"[A-Za-z0-9_-]+"' "$work/start" | cut -d'"' -f4) || { cat "$work/start" >&2; fail "nats req: no run started"; }
"$PAL" run watch "$by_name" >/dev/null || fail "the run of hello started by name did not succeed"
nats req pal.api.runs.start "{\"workflow\":$(cat "$root/examples/hello.json")}" >"$work/inline" 2>&1 || true
grep -q '"code":"forbidden"' "$work/inline" || { cat "$work/inline" >&2; fail "an inline definition over NATS was not refused"; }

# The client account was enough for all of it.
if grep -il "permissions violation" "$work/sub" "$work/get" "$work/kv" "$work/micro" "$work/req" "$work/req.err" "$work/wfs" "$work/start"; then
	fail "a replay command hit a permissions violation"
fi

# 7. The client cannot write the journal: the server refuses the
# publish and the run's journal is as it was.
echo "e2e: nats pub pal.events.$run_id (refused)"
nats pub "pal.events.$run_id" '{"forged":true}' >"$work/pub" 2>&1 || true
grep -qi "permissions violation" "$work/pub" || { cat "$work/pub" >&2; fail "nats pub to pal.events was not refused"; }
[[ $("$PAL" run events "$run_id" --json | wc -l) -eq $last_seq ]] || fail "the journal of $run_id changed"

# 8. Nor can it aim a responder at the journal: across the import the
# server answers on a reply subject of its own, back in the client
# account.
echo "e2e: nats pub --reply pal.events.$run_id to the JetStream API and \$SRV (nothing lands)"
for subj in '$JS.API.STREAM.INFO.PAL_EVENTS' '$SRV.PING' '$SRV.INFO.pal'; do
	nats pub --reply "pal.events.$run_id" "$subj" '' >"$work/deputy" 2>&1 || { cat "$work/deputy" >&2; fail "nats pub $subj failed"; }
done
nats pub --reply "pal.events.$run_id" '$JS.API.DIRECT.GET.PAL_EVENTS' "{\"last_by_subj\":\"pal.events.$run_id\"}" >"$work/deputy" 2>&1 ||
	{ cat "$work/deputy" >&2; fail "nats pub DIRECT.GET failed"; }
nats req pal.api.runs.get "{\"run_id\":\"$run_id\"}" >/dev/null 2>&1 || fail "the service stopped answering"
[[ $("$PAL" run events "$run_id" --json | wc -l) -eq $last_seq ]] || fail "a deputy's answer landed in the journal of $run_id"
"$PAL" run get "$run_id" --json | grep '"status":"succeeded"' >/dev/null || fail "run $run_id is no longer succeeded"

# 9. A durable command runs as the client user that published it: the
# server lets it publish under its own name only.
echo "e2e: nats pub pal.cmd.runs.start.client (a durable start, by the client user)"
nats pub --no-templates pal.cmd.runs.start.client '{"workflow": "hello", "input": {"text": "durable"}, "idempotency_key": "e2e-durable"}' >"$work/cmd" 2>&1 ||
	{ cat "$work/cmd" >&2; fail "nats pub pal.cmd.runs.start.client failed"; }
durable=$("$PAL" run id --key e2e-durable)
for i in $(seq 1 300); do
	"$PAL" run get "$durable" --json 2>/dev/null | grep '"status":"succeeded"' >/dev/null && break
	[[ $i -lt 300 ]] || fail "the durable start $durable did not succeed"
	sleep 0.1
done
"$PAL" run events "$durable" --json >"$work/durable" || fail "pal run events $durable failed"
# Read from a file: with pipefail, head closing the pipe early could fail
# the pal command that writes it.
head -n 1 "$work/durable" | grep -q '"worker_id":"client"' || fail "the durable start is not the client user's"
nats pub pal.cmd.runs.start.ana '{}' >"$work/pub" 2>&1 || true
grep -qi "permissions violation" "$work/pub" || { cat "$work/pub" >&2; fail "the client user published a command in another's name"; }

echo "e2e: OK: the README's replay commands work against a live run ($last_seq events), from the client account"
