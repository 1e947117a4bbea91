"""The documentation stays true: README.md and docs/*.md are read as a user would copy from them.

* every `allocscope COMMAND ... --flag` they show (in code blocks and inline code, `sudo` and a
  path before `allocscope` allowed, and inline `record --flag`-style spans) names a command of the
  click app and flags that command's `--help` lists (the app run in process with CliRunner);
* every `make TARGET` in code is a target of the Makefile;
* every relative link of README.md, docs/, bench/README.md and bench/results/ resolves to a file
  or folder of the checkout, and a `#anchor` into a markdown file to one of its headings;
* docs/trace-format.md's tables hold: the trace tables' columns are exactly the writer's schemas,
  and every key its report and diff tables list is in a real `report --format json` and
  `diff --format json` of synthetic traces (tests/synth.py: no BPF) — every element of a `[]`
  list, every value of an UPPER-CASE map.

No BPF, no root; about a second."""

from __future__ import annotations

import json
import re
import shlex
import sys
from functools import cache
from pathlib import Path

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner
from synth import MONO0, SynthTrace

from common.tracefile import format as F

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*DOCS, ROOT / "bench" / "README.md", *sorted((ROOT / "bench" / "results").glob("*.md"))]
# Written on other branches of issue 31 and linked from README's list before they merge: a link to
# one of these may be missing until then (and is checked like any other once the file exists).
PENDING: set[str] = set()  # doc files a branch not merged yet adds (none now)

FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def parts(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(code, prose) of a markdown file: code = the lines of fenced blocks (a line ending in `\\`
    joined to the next; a line of a block that starts with whitespace and `[` joined to the
    line before, as a synopsis continues) and every inline code span; prose = the other lines
    with their code spans blanked. Each with its line number."""
    code: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(path.read_text().split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if code and code[-1][1].endswith("\\"):
                code[-1] = (code[-1][0], code[-1][1][:-1] + " " + line.strip())
            elif code and re.match(r"\s+\[", line) and "allocscope" in code[-1][1]:
                code[-1] = (code[-1][0], code[-1][1] + " " + line.strip())
            else:
                code.append((n, line))
            continue
        code += [(n, m.group(2).strip()) for m in INLINE.finditer(line)]
        prose.append((n, INLINE.sub("``", line)))
    return code, prose


# --- the CLI's commands and flags -------------------------------------------------------------


def cli_group() -> click.Group:
    """The click app: allocscope.cli.app's `main` (the one click.Group there, wherever the commands live)."""
    from allocscope.cli import app as cli

    main = getattr(cli, "main", None)
    if isinstance(main, click.Group):
        return main
    (group,) = {v for v in vars(cli).values() if isinstance(v, click.Group)}
    return group


@cache
def help_flags(command: str) -> frozenset[str]:
    """The option names `allocscope COMMAND --help` lists."""
    res = CliRunner().invoke(cli_group(), [command, "--help"], prog_name="allocscope")
    assert res.exit_code == 0, res.output
    options = res.output.split("\nOptions:", 1)[1]
    flags = set()
    for line in options.split("\n"):
        if re.match(r"\s+-", line):
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            flags |= set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", head))
    return frozenset(flags)


COMMAND_SPAN = re.compile(
    r"^(?:sudo\s+)?(?:\S*/)?allocscope\s+(.*)$|^((?:record|report|diff|top|doctor|demo)"
    r"(?:\|(?:record|report|diff|top|doctor|demo))*)\s+(-.*)$"
)
IN_CODE_LINE = re.compile(r"(?:^\s*|[;&|(]\s*)((?:sudo\s+)?(?:\S*/)?allocscope\s+[a-z].*)$")


def split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=False)
    except ValueError:  # an unbalanced quote in a sample: words are enough
        return text.split()


def invocations(text: str) -> list[tuple[list[str], list[str]]]:
    """([commands], [flags]) for each allocscope command line in `text` (a code line or span)."""
    out = []
    m = COMMAND_SPAN.match(text)
    if m and m.group(2):
        commands, rest = m.group(2).split("|"), m.group(3)
    else:
        m = IN_CODE_LINE.search(text)
        if not m:
            return []
        words = split(m.group(1))
        words = words[words.index(next(w for w in words if w.endswith("allocscope"))) + 1 :]
        if not words:
            return []
        commands, rest = [words[0]], " ".join(shlex.quote(w) for w in words[1:])
    flags = []
    words = split(rest)
    for i, w in enumerate(words):
        if w in ("&&", "||", ";", "&", ">", ">>", "--") or w.startswith("#"):
            break
        if w == "|":
            if i + 1 < len(words) and words[i + 1].startswith("-"):
                continue  # a synopsis' alternatives: --pid PID | --pgrep PATTERN
            break
        w = w.strip("[](){},")
        if re.match(r"--?[A-Za-z]", w):
            flags.append(w.split("=", 1)[0])
    out.append((commands, flags))
    return out


@cache
def documented_invocations() -> list[tuple[str, int, list[str], list[str]]]:
    rows = []
    for path in DOCS:
        for n, text in parts(path)[0]:
            rows += [(path.relative_to(ROOT).as_posix(), n, c, f) for c, f in invocations(text)]
    return rows


def test_the_docs_show_commands():
    """The parsing finds what it is for: README's command block and inline spans like `top --batch`."""
    seen = {(p, tuple(c)) for p, _, c, _ in documented_invocations()}
    assert {("README.md", (c,)) for c in ("doctor", "record", "report", "diff", "top", "demo")} <= seen
    flags = {f for p, _, _, fl in documented_invocations() if p == "README.md" for f in fl}
    assert {"--pid", "--pgrep", "--format", "--fold", "--alloc-fn", "--inject", "--batch", "--dry-run"} <= flags


def test_every_documented_flag_is_in_the_commands_help():
    commands = set(cli_group().commands)
    bad = []
    for where, n, cmds, flags in documented_invocations():
        for c in cmds:
            if c not in commands:
                bad.append(f"{where}:{n}: allocscope {c}: no such command ({', '.join(sorted(commands))})")
                continue
            bad += [
                f"{where}:{n}: allocscope {c} {f}: not in `allocscope {c} --help`"
                for f in flags
                if f not in help_flags(c)
            ]
    assert bad == []


def test_the_flag_check_catches_what_it_is_for():
    assert invocations("allocscope record --pid 4242 -o run.allocscope -- ./mytool --flag") == [
        (["record"], ["--pid", "-o"])
    ]
    assert invocations("sudo /opt/allocscope-0.1.0/bin/allocscope top --pgrep 'provingd --pw 12' | tee x") == [
        (["top"], ["--pgrep"])
    ]
    assert invocations("allocscope top (--pid PID | --pgrep PATTERN) [--sort live|peak] [-- CMD]") == [
        (["top"], ["--pid", "--pgrep", "--sort"])
    ]
    assert invocations("record|top --pid PID --inject [--sample-bytes N]") == [
        (["record", "top"], ["--pid", "--inject", "--sample-bytes"])
    ]
    assert invocations("allocscope.report/1") == invocations("run.allocscope") == []
    assert invocations("a daemon (nothing of allocscope inside it)") == []
    assert invocations("make demo && allocscope report x --top 5") == [(["report"], ["--top"])]
    assert "--no-such-flag" not in help_flags("record") and "--inject" in help_flags("record")
    assert {"-o", "--output", "--format", "-h", "--help"} <= help_flags("report")


# --- make targets ----------------------------------------------------------------------------


def makefile_targets() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M)}


def make_targets(text: str) -> list[str]:
    """The targets of each `make ...` in a code line: words after `make` up to a shell operator,
    leaving out VAR=value and options."""
    out = []
    text = re.split(r"(?:^|\s)#", text)[0]  # a comment
    for m in re.finditer(r"(?:^|[\s;&|(])make\s+([^;&|]+)", text):
        out += [w for w in split(m.group(1)) if "=" not in w and not w.startswith("-")]
    return out


def test_every_documented_make_target_exists():
    targets = makefile_targets()
    assert {"demo", "test", "setup", "bench", "bundle", "lint"} <= targets
    named, bad = set(), []
    for path in DOCS:
        for n, text in parts(path)[0]:
            for t in make_targets(text):
                named.add(t)
                if t not in targets:
                    bad.append(f"{path.relative_to(ROOT)}:{n}: make {t}: no such target in the Makefile")
    assert bad == []
    assert {"demo", "test"} <= named  # README's two commands were found
    assert make_targets("sudo make demo     # set-up") == ["demo"]
    assert make_targets("make bench BENCH_ARGS='--rounds 3' && make -j2 lint; echo x # make it") == ["bench", "lint"]


# --- links -----------------------------------------------------------------------------------


def slugs(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings."""
    out, seen = set(), {}
    fenced = False
    for line in path.read_text().split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        s = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.add(s if k == 0 else f"{s}-{k}")
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for n, line in parts(path)[1]:
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
            if not dest.exists():
                if rel not in PENDING:
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {target}: no heading #{anchor} in {rel}")
    return bad


def test_every_relative_link_resolves():
    assert len(LINKED) > 20
    assert [b for p in LINKED for b in broken_links(p)] == []


def test_the_link_check_catches_what_it_is_for(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title here\n\n## The `x` part\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#the-x-part) [web](https://example.org/x)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [self](#title)\n"
        "`[in code](docs/c.md)`\n```\n[fenced](docs/d.md)\n```\n"
    )
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "docs/b.md: no such file",
        "docs/a.md#nope: no heading #nope in docs/a.md",
        "#title: no heading #title in README.md",
    ]


# --- the trace format and the JSON keys ------------------------------------------------------


def tables(path: Path, header: str) -> dict[str, list[list[str]]]:
    """{heading: rows} of the markdown tables whose first header cell is `header`, by the `##`
    heading above them; each row its cells."""
    out: dict[str, list[list[str]]] = {}
    heading, in_table = "", False
    for line in path.read_text().split("\n"):
        if line.startswith("## "):
            heading = line[3:].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            in_table = False
        elif cells[0] == header:
            in_table = True
            out.setdefault(heading, [])
        elif in_table and not set(cells[0]) <= {"-", ":"}:
            out[heading].append(cells)
    return out


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


TRACE_FORMAT = ROOT / "docs" / "trace-format.md"


def test_trace_tables_are_the_writers_schemas():
    rows = tables(TRACE_FORMAT, "table")
    (section,) = [k for k in rows if "trace directory" in k]
    documented = {ticked(r[0])[0]: r for r in rows[section]}
    assert set(documented) == {*F.TABLES, F.SYMBOLS}
    for name, row in documented.items():
        if name == "intervals":  # inferred from the probe's counters: no fixed schema
            continue
        schema = F.SYMBOLS_SCHEMA if name == F.SYMBOLS else F.SCHEMAS[name]
        assert ticked(row[2]) == schema.names, name


def write_part(t: SynthTrace, name: str, rows: list[dict]) -> None:
    t.w.write_part(name, t.seq, pa.Table.from_pylist([{"seq": t.seq, **r} for r in rows], schema=F.SCHEMAS[name]))


def rich_trace(path: Path, pw: str) -> str:
    """Everything a report can hold, once: heap, mmap, CUDA device and pinned sites, a folded
    wrapper, flows, a trim, a purge, releases, allocators, waits and blocked threads, TLB
    flushes, live blocks, a heap; sampled, so the error bars are there too."""
    t = SynthTrace(path, labels={"pw": pw})
    t.meta["sampling"] = {"sample_bytes": 4096}
    t.meta["probes"]["inject"] = {"tables_resident_bytes": 1 << 16}  # --inject: the agent's tables
    t.meta["waits"] = {"wait_min_ns": 1_000_000}
    t.meta["end"] = {  # an OOM kill (tracer/process/ending.py)
        "reason": "oom_killed",
        "exit_code": None,
        "signal": "SIGKILL",
        "oom": {"scope": "cgroup", "cgroup": "/system.slice/synthd.service", "limit_bytes": 2 << 30},
        "time": 3.5,
        "last_alive": {"seq": 3, "elapsed_s": 3.0},
    }
    t.meta["children"] = {  # a forked helper that did little (tracer/record/children.py)
        "seen": 1,
        "forked": 1,
        "unseen": 0,
        "alive": 1,
        "polls": 4,
        "target_cpu_s": 1.0,
        "cpu_s": 0.01,
        "rss_max_bytes": 4 << 20,
        "anon_max_bytes": 1 << 20,
        "listed": [
            {
                "pid": 4243,
                "comm": "synthd-helper",
                "exe": "/usr/bin/synthd",
                "cpu_s": 0.01,
                "rss_max_bytes": 4 << 20,
                "anon_max_bytes": 1 << 20,
                "alive": True,
            }
        ],
    }
    t.meta["probes"]["allocators"] = [
        {
            "kind": "glibc",
            "module": "/lib/x86_64-linux-gnu/libc.so.6",
            "prefix": "",
            "source": "heap",
            "serves_malloc": True,
            "attached": ["malloc", "free"],
            "aliases": {},
            "skipped": {},
            "placement": {},
        }
    ]
    t.cuda_driver()
    src = "/src/synthd/"
    a = t.stack(
        ["malloc", "zmalloc", "make_partition", "worker", "start_thread"],
        files=[None, None, src + "p.c", src + "w.c", None],
        lines=[None, None, 42, 10, None],
    )
    b = t.stack(["mmap", "map_arena", "main"])
    g = t.stack(["cuMemAlloc_v2", "upload", "main"])
    h = t.stack(["cuMemHostAlloc", "stage", "main"])
    w = t.stack(
        ["pthread_cond_wait", "channel_push", "worker", "start_thread"],
        files=[None, src + "c.c", src + "w.c", None],
        lines=[None, 7, 11, None],
    )
    t.thread(101, "synthd")
    t.thread(102, "pworker-1")
    for i in range(1, 6):
        t.interval(
            {
                (a, 102): (8192 * i, 2 * i, 0, 0),
                (b, 101, "mmap"): (1 << 20, 1, 0, 0),
                (g, 101, "cuda-device"): (1 << 24, 1, 0, 0),
                (h, 101, "cuda-pinned"): (1 << 21, 1, 0, 0),
            },
            rss=(40 << 20) + i,
            shmem=2 << 20,
            flows={(102, 101): (100, 1, 5_000_000, 1_000_000)},
            lost={
                "n_waits": 10 * i,
                "n_waits_short": i,
                "n_wait_short_ns": 1000 * i,
                "lost_wait_full": 0,
                "tlb_local_mm_shootdown_flushes": i,
                "tlb_local_mm_shootdown_pages": 2 * i,
                "tlb_local_mm_shootdown_full": 0,
            },
        )
        write_part(
            t, "waits", [{"tid": 102, "stack_id": w, "count": i, "total_ns": i * 5_000_000, "max_ns": 5_000_000}]
        )
        write_part(
            t, "blocked", [{"tid": 102, "stack_id": w, "since_ns": MONO0, "waited_ns": i * 1_000_000, "state": "S"}]
        )
        write_part(
            t,
            "releases",
            [
                {
                    "tid": 101,
                    "kind": "munmap",
                    "in_api": "",
                    "calls": i,
                    "requested_bytes": 4096 * i,
                    "released_bytes": 4096 * i,
                    "duration_ns": 1000 * i,
                    "stack_id": b,
                }
            ],
        )
        write_part(
            t,
            "allocators",
            [
                {
                    "source": "heap",
                    "kind": "glibc",
                    "mapped_bytes": 1 << 22,
                    "resident_bytes": 1 << 21,
                    "live_bytes": 8192 * i,
                    "ranges": 1,
                }
            ],
        )
        if i == 3:
            write_part(
                t,
                "purges",
                [
                    {
                        "ts_ns": MONO0,
                        "tid": 101,
                        "source": "heap",
                        "function": "malloc_trim",
                        "name": "",
                        "duration_ns": 10_000,
                        "rss_before_bytes": 1 << 22,
                        "rss_after_bytes": 1 << 21,
                        "released_bytes": 1 << 21,
                    }
                ],
            )
            t.trim(101, 3.0, 0.001)
    t.live_block(a, 102, 8192, 1.0)
    t.heaps([(0x1000000, 0x2000000, 0x2000000, "main", "main", 1 << 21, 0)])
    return t.close()


def cli_json(*args: str) -> dict:
    res = CliRunner().invoke(cli_group(), [*args, "--format", "json"], prog_name="allocscope")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("docs")
    a, b = rich_trace(d / "a.allocscope", "3"), rich_trace(d / "b.allocscope", "4")
    return {"allocscope.report/1": cli_json("report", a), "allocscope.diff/1": cli_json("diff", a, b, "--per", "pw")}


def resolve(doc: dict, path: str) -> list:
    """The objects at `path`: `a.b[]` every element of list b, `A.SOURCE` every value of map A."""
    objs = [doc]
    if path == "(top)":
        return objs
    for seg in path.split("."):
        nxt = []
        name, is_list = (seg[:-2], True) if seg.endswith("[]") else (seg, False)
        for o in objs:
            if re.fullmatch(r"[A-Z_]+", name):
                vals = list(o.values()) if isinstance(o, dict) else []
            else:
                vals = [o[name]] if isinstance(o, dict) and name in o else []
            for v in vals:
                nxt += v if is_list and isinstance(v, list) else [] if is_list else [v]
        objs = nxt
    return objs


def missing_keys(doc: dict, rows: list[list[str]]) -> list[str]:
    bad = []
    for row in rows:
        (path,) = ticked(row[0]) or [row[0]]
        objs = resolve(doc, path)
        if not objs or not all(isinstance(o, dict) for o in objs):
            bad.append(f"{path}: no such object in the synthetic document (or extend rich_trace)")
            continue
        bad += [f"{path}: no key {k}" for k in ticked(row[1]) if any(k not in o for o in objs)]
    return bad


def test_documented_json_keys_are_in_real_documents(documents):
    rows = tables(TRACE_FORMAT, "object")
    by_schema = {s: r for s in documents for h, r in rows.items() if s in h}
    assert set(by_schema) == set(documents)
    assert len(by_schema["allocscope.report/1"]) > 40 and len(by_schema["allocscope.diff/1"]) > 8
    for schema, doc in documents.items():
        assert doc["schema"] == schema
        assert missing_keys(doc, by_schema[schema]) == [], schema


def test_the_key_check_catches_what_it_is_for(documents):
    doc = documents["allocscope.report/1"]
    assert len(resolve(doc, "sites[].frames[]")) > 4
    assert resolve(doc, "waits.freeing.tlb.REASON") == [{"flushes": 5, "pages": 10, "full": 0}]
    assert missing_keys(
        doc,
        [["`sites[]`", "`rank` `no_such_key`"], ["`nothing[]`", "`x`"], ["`folded[]`", "`pattern` `from` `functions`"]],
    ) == ["sites[]: no key no_such_key", "nothing[]: no such object in the synthetic document (or extend rich_trace)"]
