"""test/docs/blocks.py: find, run and check the examples of Markdown files.

test/docs/run starts the cluster and the broker and calls this; the
conventions it implements are described at the top of test/docs/run.
Python's standard library only.
"""

import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RUN_LANGS = ("sql", "sh")
WILDCARD = "\u2026"
SKIP_RE = re.compile(r"^\s*<!--\s*not run(?::\s*(.*?))?\s*-->\s*$")
FENCE_RE = re.compile(r"^( {0,3}|\s*)(`{3,}|~{3,})\s*([^\s`]*)")
# How long a read-only sql block is retried while its output differs, how
# long any block may run.
RETRY_SECONDS = float(os.environ.get("DOCS_RETRY_SECONDS", "10"))
BLOCK_TIMEOUT = float(os.environ.get("DOCS_BLOCK_TIMEOUT", "60"))


class Block:
    """A fenced block: its language, first line, text; its output block."""

    def __init__(self, lang, line, text, skip=None):
        self.lang = lang
        self.line = line
        self.text = text
        self.skip = skip          # None, or the reason given
        self.expected = None      # the ```output block's text, or None
        self.problem = None       # a mistake in the Markdown itself


def parse(path):
    """The blocks of the Markdown file at path, in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    i = 0
    previous = ""             # the last non-blank line before a block
    only_blank = False        # only blank lines since the last block closed
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            if lines[i].strip():
                previous = lines[i]
                only_blank = False
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start = i + 1
        body = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and close.strip(fence[0]) == "":
                break
            line = lines[i]
            # Inside a list item a block is indented: take the fence's
            # indentation off each line, as CommonMark does.
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            body.append(line[strip:])
            i += 1
        i += 1
        text = "\n".join(body)
        if lang == "output":
            attach_output(blocks, start, text, only_blank)
        else:
            skip = None
            sm = SKIP_RE.match(previous)
            if sm:
                skip = sm.group(1) or ""
            blocks.append(Block(lang, start, text, skip))
        previous = ""
        only_blank = True
    return blocks


def attach_output(blocks, line, text, only_blank):
    """Make an ```output block at line the expected output of the block
    just before it; one that follows no sql or sh block is a mistake."""
    last = blocks[-1] if blocks else None
    if (only_blank and last is not None and last.lang in RUN_LANGS
            and last.expected is None):
        last.expected = text
        return
    orphan = Block("output", line, text)
    orphan.problem = "an output block must follow an sql or sh block, with only blank lines between"
    blocks.append(orphan)


# --- comparing --------------------------------------------------------------

def normalize(text):
    """Lines without trailing whitespace, trailing blank lines dropped."""
    lines = [l.rstrip() for l in text.split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def line_matches(want, got):
    """Whether got matches want, where U+2026 in want is any text."""
    if WILDCARD not in want:
        return want == got
    pattern = ".*".join(re.escape(part) for part in want.split(WILDCARD))
    return re.fullmatch(pattern, got, re.DOTALL) is not None


def output_matches(expected, actual):
    """Whether actual matches expected, line for line."""
    want, got = normalize(expected), normalize(actual)
    return len(want) == len(got) and all(line_matches(w, g) for w, g in zip(want, got))


def diff(expected, actual):
    """The unified diff of expected and actual, as lines."""
    return list(difflib.unified_diff(normalize(expected), normalize(actual),
                                     "expected", "actual", lineterm="", n=2))


# --- which sql blocks may be retried -----------------------------------------

READ_STARTS = ("select", "with", "table", "values", "show")
# Words that make a block one with side effects: statements, and the
# functions of outbox and of PostgreSQL that change something.
WRITE_WORDS = re.compile(r"\b(" + "|".join([
    "insert", "update", "delete", "merge", "alter", "create", "drop", "set",
    "reset", "grant", "revoke", "truncate", "copy", "call", "do", "begin",
    "commit", "rollback", "prepare", "vacuum", "analyze", "cluster",
    "reindex", "lock", "notify", "listen", "discard", "load", "checkpoint",
    "enqueue", "enqueue_bytes", "claim", "pause", "resume", "replay",
    "replay_dead", "resend", "purge", "nextval", "setval",
    r"pg_\w*(?:reload|terminate|cancel|switch|create|drop|advance|promote|"
    r"reset|rotate|write)\w*", r"pg_log_\w*",
]) + r")\b", re.IGNORECASE)
# Meta-commands that only format or describe.
QUIET_META = re.compile(r"^\\(x|pset|echo|d\S*|timing|a|t)\b")


def strip_sql(text):
    """text without comments and quoted strings (literals, identifiers,
    dollar-quoted bodies), so that a word inside one does not count."""
    text = re.sub(r"\$(\w*)\$.*?\$\1\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"'(?:[^']|'')*'", " ", text)
    text = re.sub(r'"(?:[^"]|"")*"', " ", text)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", " ", text)


def read_only(text):
    """Whether an sql block only reads: every statement starts with
    SELECT, WITH, TABLE, VALUES or SHOW, no word of WRITE_WORDS appears
    outside strings and comments, and its meta-commands only format."""
    sql_lines = []
    for line in strip_sql(text).split("\n"):
        if line.strip().startswith("\\"):
            if not QUIET_META.match(line.strip()):
                return False
            continue
        sql_lines.append(line)
    body = "\n".join(sql_lines)
    statements = [s.strip() for s in body.split(";") if s.strip()]
    if not statements or WRITE_WORDS.search(body):
        return False
    return all(s.split(None, 1)[0].lower() in READ_STARTS for s in statements)


# --- running ------------------------------------------------------------------

class Runner:
    """Runs blocks and prints TAP lines; counts them."""

    def __init__(self, out=sys.stdout, number=0, retry_seconds=RETRY_SECONDS):
        # retry_seconds: how long a read-only block is retried.
        self.out = out
        self.retry_seconds = retry_seconds
        self.n = number
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.results = []     # (line, lang, "ok" | "not ok" | "skip")

    def say(self, text):
        """Print one line of the report."""
        self.out.write(text + "\n")
        self.out.flush()

    def note(self, lines):
        """Print lines as TAP diagnostics under the last test."""
        for line in lines:
            self.say("#   " + line)

    def report(self, name, line, lang, ok, detail="", skip=None):
        """Print one block's TAP line and count it."""
        self.n += 1
        label = f"{name}:{line} {lang}"
        if skip is not None:
            self.skipped += 1
            self.results.append((line, lang, "skip"))
            self.say(f"ok {self.n} - {label} # SKIP {skip}")
        elif ok:
            self.passed += 1
            self.results.append((line, lang, "ok"))
            self.say(f"ok {self.n} - {label}{detail}")
        else:
            self.failed += 1
            self.results.append((line, lang, "not ok"))
            self.say(f"not ok {self.n} - {label}{detail}")

    def run_file(self, path, name, env, workdir):
        """Run path's blocks in order; name labels them (its path from the
        repository root)."""
        others = {}
        for b in parse(path):
            if b.problem:
                self.report(name, b.line, b.lang, False)
                self.note([b.problem])
                continue
            if b.lang not in RUN_LANGS:
                others[b.lang or "(none)"] = others.get(b.lang or "(none)", 0) + 1
                continue
            if b.skip is not None:
                if b.skip.strip():
                    self.report(name, b.line, b.lang, True, skip=b.skip.strip())
                else:
                    self.report(name, b.line, b.lang, False)
                    self.note(["<!-- not run --> needs a reason: <!-- not run: REASON -->"])
                continue
            self.run_block(b, name, env, workdir)
        if others:
            # A ```bash or ```psql block is easily taken for one that runs.
            self.say(f"# {name}: never run, by their language: "
                     + ", ".join(f"{n} {lang}" for lang, n in sorted(others.items())))

    def run_block(self, b, name, env, workdir):
        """Run b, again while a read-only block's output differs, and report it."""
        retry = b.lang == "sql" and b.expected is not None and read_only(b.text)
        started = time.monotonic()
        tries = 0
        while True:
            tries += 1
            status, out, err = execute(b, env, workdir, retry)
            ok = status_ok(b, status) and (b.expected is None or output_matches(b.expected, out))
            # Only an output that differs is retried: an error stays.
            if ok or not retry or status != 0 or time.monotonic() - started >= self.retry_seconds:
                break
            time.sleep(0.5)
        detail = f" (try {tries}, {time.monotonic() - started:.1f} s)" if tries > 1 else ""
        self.report(name, b.line, b.lang, ok, detail)
        if not ok:
            self.explain(b, status, out, err, retry, tries)

    def explain(self, b, status, out, err, retry, tries):
        """Why b failed: its exit status, the diff, its stderr."""
        if status is None:
            self.note([f"cut after {BLOCK_TIMEOUT:g} s (DOCS_BLOCK_TIMEOUT)"])
        elif not status_ok(b, status):
            self.note([f"exit status {status}"])
        if b.expected is not None and not output_matches(b.expected, out):
            self.note(["output differs (- expected, + actual):"] + diff(b.expected, out))
            if len(normalize(b.expected)) != len(normalize(out)) and WILDCARD in b.expected:
                self.note([f"({WILDCARD} matches within one line: one expected line per line of output)"])
        elif b.expected is None and out.strip() and status != 0:
            self.note(["stdout:"] + normalize(out))
        if err.strip():
            self.note(["stderr:"] + normalize(err)[-30:])
        if retry:
            self.note([f"read-only: tried {tries} times over {self.retry_seconds:g} s"])

    def summary(self):
        """The closing lines: skips, then "N passed, N failed"."""
        if self.skipped:
            self.say(f"# {self.skipped} skipped")
        self.say(f"{self.passed} passed, {self.failed} failed")


def expects_error(b):
    """An sql block whose expected output shows an ERROR line is expected
    to fail, and its stderr is compared along with its stdout."""
    return (b.lang == "sql" and b.expected is not None
            and any(l.startswith("ERROR:") for l in b.expected.split("\n")))


def status_ok(b, status):
    """Whether an exit status (None: cut by the timeout) is a success for b."""
    if status is None:
        return False
    if expects_error(b):
        return status in (0, 3)
    return status == 0


def execute(b, env, workdir, read_only_block):
    """Run one block: (exit status or None on timeout, stdout, stderr)."""
    run_env = dict(env)
    if b.lang == "sql":
        cmd = [env.get("DOCS_PSQL", "psql"), "-X", "-v", "ON_ERROR_STOP=1"]
        if read_only_block:
            # A safety net under the word list: a retried block that
            # writes after all fails instead of writing twice.
            run_env["PGOPTIONS"] = (env.get("PGOPTIONS", "") + " -c default_transaction_read_only=on").strip()
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-s"]
    merge = expects_error(b)
    # A group of its own, so that a timeout ends what the block started
    # too (a kcat still waiting), not only its shell.
    p = subprocess.Popen(cmd, cwd=workdir, env=run_env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                         text=True, errors="replace", start_new_session=True)
    RUNNING.add(p.pid)
    try:
        stdout, stderr = p.communicate(b.text + "\n", timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_group(p.pid)
        stdout, _ = p.communicate()
        return None, stdout or "", ""
    finally:
        kill_group(p.pid)
        RUNNING.discard(p.pid)
    out = stdout
    if merge:
        # psql names its input before an error it read from stdin.
        out = re.sub(r"(?m)^psql:<stdin>:\d+: ", "", out)
    return p.returncode, out, stderr or ""


RUNNING = set()


def kill_group(pid):
    """End the process group of a block (whatever is left of it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop(signum, frame):
    """SIGTERM or SIGINT (test/run's deadline): end the running block's
    group, then exit, so test/docs/run's EXIT trap tears down the rest."""
    for pid in list(RUNNING):
        kill_group(pid)
    sys.exit(128 + signum)


# --- a database and a copy of the tree per file -------------------------------

def psql_admin(env, sql):
    """Run sql as the cluster's superuser in database postgres."""
    e = dict(env, PGDATABASE="postgres")
    p = subprocess.run([env.get("DOCS_PSQL", "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{sql}: {p.stderr.strip()}")
    return p.stdout


def database_name(name):
    """docs/kafka.md -> docs_docs_kafka: one database per file."""
    base = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return ("docs_" + base)[:63]


def roles(env):
    """The cluster's role names."""
    return set(psql_admin(env, "SELECT rolname FROM pg_roles").split())


def prepare(env, db):
    """A fresh database db with outbox created in it."""
    psql_admin(env, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    psql_admin(env, f'CREATE DATABASE "{db}"')
    e = dict(env, PGDATABASE=db)
    subprocess.run([env.get("DOCS_PSQL", "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                    "-c", "CREATE EXTENSION outbox"], env=e, check=True)


def clean_up(env, db, roles_before, keep):
    """Put the cluster back as the next file expects it: the file's
    database dropped (its relay with it), ALTER SYSTEM undone, the roles
    it created dropped."""
    problems = []
    try:
        if not keep:
            psql_admin(env, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        psql_admin(env, "ALTER SYSTEM RESET ALL")
        psql_admin(env, "SELECT pg_reload_conf()")
        for role in sorted(roles(env) - roles_before):
            try:
                psql_admin(env, f'DROP ROLE "{role}"')
            except RuntimeError as e:
                problems.append(str(e))
    except RuntimeError as e:
        problems.append(str(e))
    return problems


def copy_tree(root):
    """A copy of the repository's files (tracked, and new ones git does
    not ignore) for the sh blocks to run in."""
    dest = tempfile.mkdtemp(prefix="outbox-docs-tree.")
    listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if listed.returncode != 0:
        # Not a git work tree (test/matrix copies the files alone): the
        # directory as it is, without what the build made in it.
        os.rmdir(dest)
        shutil.copytree(root, dest, symlinks=True,
                        ignore=shutil.ignore_patterns("*.o", "*.so", "*.bc", "results",
                                                      "output_iso", "regression.*"))
        return dest
    files = listed.stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        rel = f.decode()
        src = os.path.join(root, rel)
        if not os.path.lexists(src):
            continue
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)
    return dest


def run_files(runner, root, files, env, keep=False):
    """Each file's blocks in a database of its own and a copy of the tree."""
    for path in files:
        name = os.path.relpath(path, root)
        db = database_name(name)
        before = roles(env)
        prepare(env, db)
        workdir = copy_tree(root)
        try:
            runner.run_file(path, name, dict(env, PGDATABASE=db), workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            for problem in clean_up(env, db, before, keep):
                runner.say(f"# {name}: cleaning up: {problem}")


# --- the self-test -------------------------------------------------------------

EXPECT_RE = re.compile(r"expect: (ok|not ok|skip)\b")
DECLARED_RE = re.compile(r"<!-- self-test: (\d+) passed, (\d+) failed, (\d+) skipped -->")


def self_test(runner, root, fixture, env):
    """Run fixture's blocks with a runner of their own and check that it
    reports exactly what each block says it should (a comment "expect: ok",
    "expect: not ok" or "expect: skip" in the block) and the totals the
    fixture declares: a runner that cannot fail, or that runs a block it
    must not, fails here."""
    import io
    name = os.path.relpath(fixture, root)
    wanted = {}
    for b in parse(fixture):
        m = EXPECT_RE.search(b.text)
        if m:
            wanted[b.line] = m.group(1)
    with open(fixture, encoding="utf-8") as f:
        declared = DECLARED_RE.search(f.read())
    inner_out = io.StringIO()
    # The same retry window as the docs get: the fixture's delivery must
    # pass in it under the same load.
    inner = Runner(out=inner_out)
    run_files(inner, root, [fixture], env)
    inner.summary()
    problems = []
    got = {line: result for line, _, result in inner.results}
    for line in sorted(set(wanted) | set(got)):
        w, g = wanted.get(line, "(not run)"), got.get(line, "(not run)")
        if w != g:
            problems.append(f"{name}:{line}: expected {w}, the runner reported {g}")
    if not declared:
        problems.append(f"{name} declares no totals (<!-- self-test: N passed, N failed, N skipped -->)")
    else:
        want = tuple(int(x) for x in declared.groups())
        have = (inner.passed, inner.failed, inner.skipped)
        if want != have:
            problems.append(f"totals: expected {want[0]} passed, {want[1]} failed, {want[2]} skipped; "
                            f"the runner reported {have[0]} passed, {have[1]} failed, {have[2]} skipped")
    last = inner_out.getvalue().strip().split("\n")[-1]
    if last != f"{inner.passed} passed, {inner.failed} failed":
        problems.append(f"the runner's last line is {last!r}")
    runner.report(name, 1, "self-test", not problems,
                  f" ({inner.passed} passed, {inner.failed} failed, {inner.skipped} skipped, as expected)"
                  if not problems else "")
    if problems:
        runner.note(problems)
        runner.note(["the runner's report on the fixture:"] + ["  " + l for l in inner_out.getvalue().rstrip().split("\n")])


def reference_check(runner, root, env):
    """test/docs/reference against the server, as one test."""
    script = os.path.join(root, "test", "docs", "reference")
    p = subprocess.run([script], cwd=root, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    runner.report("docs/reference.md", 1, "reference", p.returncode == 0)
    runner.note(normalize(p.stdout))


def main(argv):
    """blocks.py [--self-test] [--reference] [--examples FILE...]: the
    parts of test/docs/run, against the cluster and broker of the
    environment (PGHOST, PGPORT, PGUSER, BROKERS)."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    env = dict(os.environ)
    runner = Runner()
    parts = argv[1:]
    files = []
    if "--examples" in parts:
        files = parts[parts.index("--examples") + 1:]
        parts = parts[:parts.index("--examples")]
    for part in parts:
        if part == "--self-test":
            for fixture in sorted(os.listdir(os.path.join(root, "test", "docs", "fixtures"))):
                if fixture.endswith(".md"):
                    self_test(runner, root, os.path.join(root, "test", "docs", "fixtures", fixture), env)
        elif part == "--reference":
            reference_check(runner, root, env)
        else:
            sys.exit(f"blocks.py: unknown argument {part}")
    run_files(runner, root, [os.path.abspath(f) for f in files], env,
              keep=env.get("DOCS_KEEP") == "1")
    runner.summary()
    return 0 if runner.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
