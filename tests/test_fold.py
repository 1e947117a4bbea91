"""Application wrappers folded out of sites (issue 12): redis' zmalloc*, CPython's
PyObject_Malloc/PyMem_*, GLib's g_malloc*, OpenSSL's CRYPTO_*alloc, xmalloc-style, and the
user's `--fold` patterns. Exact frames on hand-made stacks and on synthetic traces; the report
says what was folded; diff matches sites after folding."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from synth import SynthTrace

from allocscope.cli.app import main
from allocscope.cli.diff import diff
from common.errors import UsageError
from reports import analysis as A
from reports.analysis.diff import diff_traces
from reports.render.diff_text import diff_to_text
from reports.render.flamegraph import to_folded
from reports.render.text import to_text
from reports.trace import load_trace

EXE, LIBC = "/usr/bin/redis-server", "/lib/x86_64-linux-gnu/libc.so.6"


def frames(*names: str, module: str = EXE) -> tuple[A.FrameInfo, ...]:
    """Innermost first; a name 'fn@module' sets that frame's module."""
    out = []
    for n in names:
        fn, _, mod = n.partition("@")
        out.append(A.FrameInfo(fn, mod or module, None, None))
    return tuple(out)


def names(fr) -> list[str]:
    return [f.function for f in fr]


# --------------------------------------------------------------------------------------------- parser
def test_parse_fold_normalizes():
    f = A.parse_fold(["pool_get, Arena::alloc*", "pool_get", "std::map<int, long>::insert,f(int, char)"])
    assert f.user == ("pool_get", "Arena::alloc*", "std::map<int, long>::insert", "f(int, char)")
    assert A.parse_fold(()).user == () and A.parse_fold(None).user == () and A.parse_fold("x").user == ("x",)


@pytest.mark.parametrize(
    "value,message",
    [
        ("", "--fold wants FUNC[,FUNC...]"),
        ("a,,b", "--fold wants FUNC[,FUNC...]"),
        ("a,", "--fold wants"),
        ("*", "would fold every frame"),
        ("a,*?", "'*?' would fold every frame"),
        ("[!]*", "would fold every frame"),
    ],
)
def test_parse_fold_rejects(value, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("*", r"\*").replace("?", r"\?")):
        A.parse_fold([value])


def test_exact_names_and_globs():
    f = A.parse_fold(["pool", "slab_*", "Arena::get(unsigned long)"])
    assert f.match("pool") == ("--fold", "pool")
    assert f.match("pool_get") is None  # exact: the whole name, nothing more
    assert f.match("slab_alloc") == ("--fold", "slab_*") and f.match("my_slab_alloc") is None
    assert f.match("Arena::get(unsigned long)") == ("--fold", "Arena::get(unsigned long)")
    assert f.match("zmalloc_usable") == ("redis", "zmalloc*")  # built-ins stay on
    assert A.DEFAULT_FOLDING.match("pool") is None and A.DEFAULT_FOLDING.match("Zmalloc") is None


# --------------------------------------------------------------------------------------------- fold_frames
@pytest.mark.parametrize(
    "stack,site",
    [
        # redis (jemalloc's malloc was probed; the stack starts at its caller, inlines expanded)
        (
            ["ztrymalloc_usable_internal", "zmalloc_usable", "createStringObject", "processInlineBuffer", "main"],
            ["createStringObject", "processInlineBuffer", "main"],
        ),
        (["zcalloc_usable", "zcalloc", "createClient", "main"], ["createClient", "main"]),
        (
            ["malloc@" + LIBC, "ztryrealloc_usable_internal", "zrealloc_usable", "sdsMakeRoomFor", "main"],
            ["sdsMakeRoomFor", "main"],
        ),
        # CPython: small objects, big objects, and a pymalloc arena mapped for the object that asked
        (
            ["PyObject_Malloc", "list_append", "method_vectorcall_O", "_PyEval_EvalFrameDefault"],
            ["list_append", "method_vectorcall_O", "_PyEval_EvalFrameDefault"],
        ),
        (
            [
                "malloc@" + LIBC,
                "_PyMem_RawMalloc",
                "PyMem_RawMalloc",
                "_PyObject_Malloc",
                "PyObject_Malloc",
                "PyList_New",
            ],
            ["PyList_New"],
        ),
        (
            [
                "mmap@" + LIBC,
                "_PyObject_ArenaMmap",
                "new_arena",
                "allocate_from_new_pool",
                "pymalloc_alloc",
                "_PyObject_Malloc",
                "PyUnicode_New",
                "main",
            ],
            ["PyUnicode_New", "main"],
        ),
        # GLib, OpenSSL, xmalloc
        (["g_malloc0", "g_hash_table_new_full", "main"], ["g_hash_table_new_full", "main"]),
        (["g_try_malloc_n", "g_malloc_n", "load_file", "main"], ["load_file", "main"]),
        (["CRYPTO_zalloc", "SSL_new", "accept_conn"], ["SSL_new", "accept_conn"]),
        (["CRYPTO_malloc", "CRYPTO_strdup", "BIO_new_file"], ["BIO_new_file"]),
        (["xmalloc", "xstrdup", "parse_args", "main"], ["parse_args", "main"]),
        # only a run from the allocator's side folds; a wrapper name further up stays
        (["parse_request", "zmalloc", "main"], ["parse_request", "zmalloc", "main"]),
        # at least one frame is kept
        (["zmalloc", "zcalloc"], ["zcalloc"]),
    ],
)
def test_builtin_wrappers_fold(stack, site):
    assert names(A.fold_frames(frames(*stack))) == site


def test_inject_agent_frames_fold():
    # --inject --unwind fp: the frame-pointer walk starts inside the agent's hook (its file is the
    # agent's: tracer/inject/agent.py AGENT_NAME); the hook, the allocator shims and Rust's
    # GlobalAlloc forwarding fold away, the code that asked stays
    agent = "/opt/allocscope/python/tracer/inject/agent/allocscope-agent.so"
    stack = (
        *frames("call_sampled", "as_h_calloc", module=agent),
        *frames(
            "<rustd::Jem as core::alloc::global::GlobalAlloc>::alloc_zeroed",
            "__rustc::__rust_alloc_zeroed",
            "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
            "rustd::serve::cache_entry",
            "rustd::serve::worker",
        ),
    )
    assert names(A.fold_frames(stack)) == ["rustd::serve::cache_entry", "rustd::serve::worker"]
    # a program's own function of the same name is not the agent's
    own = frames("as_h_calloc", "main")
    assert names(A.fold_frames(own)) == ["as_h_calloc", "main"]


def test_statically_linked_program_is_not_folded_away():
    # redis linked statically with its allocator: one module; malloc's internals go, the program stays.
    static = frames(
        "_int_malloc", "malloc", "ztrymalloc_usable_internal", "zmalloc_usable", "createStringObject", "main"
    )
    assert names(A.fold_frames(static)) == ["createStringObject", "main"]
    # A wrapper-looking name far up is never a cut point, whatever --fold says about other frames.
    f = A.parse_fold(["handler*"])
    assert names(A.fold_frames(frames("do_work", "zmalloc", "handler_loop", "main"), f)) == [
        "do_work",
        "zmalloc",
        "handler_loop",
        "main",
    ]
    # A user pattern that matches every frame still leaves the outermost one.
    assert names(A.fold_frames(frames("f1", "f2", "f3"), A.parse_fold(["f?"]))) == ["f3"]


def test_user_fold():
    stack = frames("pool_get_block", "Arena::alloc(unsigned long)", "Session::new_request()", "main")
    assert names(A.fold_frames(stack)) == names(stack)
    f = A.parse_fold(["pool_*,Arena::alloc*"])
    assert names(A.fold_frames(stack, f)) == ["Session::new_request()", "main"]
    assert names(A.fold_frames(stack, A.parse_fold(["pool_get_block"]))) == [
        "Arena::alloc(unsigned long)",
        "Session::new_request()",
        "main",
    ]


# --------------------------------------------------------------------------------------------- reports
def _redis_trace(path, run: str = "a", pool: str = "pool_get", id_base: int = 0x1000) -> str:
    """Sites (innermost first, after built-in folding):
    createStringObject  4096 B live: 3000 via zmalloc_usable (ztrymalloc inlined) + 1096 via zcalloc_usable
    list_append          800 B live, via PyObject_Malloc
    handler             5000 B live, via `pool` (a user wrapper) over malloc
    """
    t = SynthTrace(path, exe=EXE, module=EXE, id_base=id_base, ip_base=id_base << 8, pid=100 if run == "a" else 200)
    z1 = t.stack(
        ["ztrymalloc_usable_internal", "zmalloc_usable", "createStringObject", "main"],
        [None, None, "object.c", "server.c"],
        [None, None, 41, 7],
    )
    z2 = t.stack(["zcalloc_usable", "createStringObject", "main"], [None, "object.c", "server.c"], [None, 41, 7])
    py = t.stack(["PyObject_Malloc", "list_append", "main"])
    pl = t.stack(["malloc", pool, "handler", "main"])
    t.thread(1, "redis-server")
    t.interval({(z1, 1): (3000, 3, 0, 0), (z2, 1): (1096, 1, 0, 0), (py, 1): (800, 2, 0, 0), (pl, 1): (5000, 5, 0, 0)})
    return t.close()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return load_trace(_redis_trace(tmp_path_factory.mktemp("fold") / "redis.allocscope"))


def test_report_sites_and_what_was_folded(trace):
    doc = A.build_report(trace, fold=A.parse_fold(["pool_*", "nosuch"]))
    got = [([f["function"] for f in s["frames"]], s["live_bytes"]) for s in doc["sites"]]
    assert got == [(["handler", "main"], 5000), (["createStringObject", "main"], 4096), (["list_append", "main"], 800)]
    first = doc["sites"][1]
    assert (first["frames"][0]["file"], first["frames"][0]["line"]) == ("object.c", 41)
    assert [f["function"] for f in doc["sites"][0]["full_frames"]] == ["malloc", "pool_get", "handler", "main"]
    assert doc["folded"] == [
        {"pattern": "zmalloc*", "from": "redis", "functions": ["zmalloc_usable"]},
        {"pattern": "ztrymalloc*", "from": "redis", "functions": ["ztrymalloc_usable_internal"]},
        {"pattern": "zcalloc*", "from": "redis", "functions": ["zcalloc_usable"]},
        {"pattern": "PyObject_Malloc", "from": "cpython", "functions": ["PyObject_Malloc"]},
        {"pattern": "pool_*", "from": "--fold", "functions": ["pool_get"]},
        {"pattern": "nosuch", "from": "--fold", "functions": []},
    ]
    text = to_text(doc)
    assert (
        "folded out of sites: zmalloc_usable [redis zmalloc*]; ztrymalloc_usable_internal [redis ztrymalloc*]; "
        "zcalloc_usable [redis zcalloc*]; PyObject_Malloc [cpython PyObject_Malloc]; pool_get [--fold pool_*]; "
        "no frame matched [--fold nosuch]\n"
    ) in text
    # Without --fold the pool wrapper is the site, and only the built-ins are listed.
    plain = A.build_report(trace)
    assert [s["frames"][0]["function"] for s in plain["sites"]] == ["pool_get", "createStringObject", "list_append"]
    assert [f["pattern"] for f in plain["folded"]] == ["zmalloc*", "ztrymalloc*", "zcalloc*", "PyObject_Malloc"]


def test_folded_stacks_follow_the_fold(trace):
    assert to_folded(trace, fold=A.parse_fold(["pool_get"])) == (
        "main;createStringObject 4096\nmain;handler 5000\nmain;list_append 800\n"
    )


def test_cli_report_fold(trace):
    r = CliRunner().invoke(main, ["report", trace.path, "--format", "json", "--fold", "pool_*", "--fold", "x,y"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sites"][0]["frames"][0]["function"] == "handler"
    assert [(f["pattern"], f["functions"]) for f in doc["folded"] if f["from"] == "--fold"] == [
        ("pool_*", ["pool_get"]),
        ("x", []),
        ("y", []),
    ]
    r = CliRunner().invoke(main, ["report", trace.path, "--format", "folded", "--fold", "pool_get"])
    assert "main;handler 5000\n" in r.stdout


@pytest.mark.parametrize("cmd", ["report", "diff"])
@pytest.mark.parametrize("value", ["", "*", "a,,b"])
def test_cli_bad_fold_is_one_line(trace, cmd, value):
    args = [trace.path] * (2 if cmd == "diff" else 1)
    r = CliRunner().invoke(main, [cmd, *args, "--fold", value])
    assert r.exit_code == 2
    assert r.stderr.startswith("allocscope: --fold") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.output


def test_diff_matches_sites_after_folding(tmp_path):
    # Run B inlined differently (no ztrymalloc frame) and its pool function has another name.
    a = load_trace(_redis_trace(tmp_path / "a.allocscope"))
    t = SynthTrace(tmp_path / "b.allocscope", exe=EXE, module=EXE, id_base=0x9000, ip_base=0x900000, pid=200)
    z = t.stack(["zmalloc_usable", "createStringObject", "main"], [None, "object.c", "server.c"], [None, 41, 7])
    pl = t.stack(["malloc", "pool_get_fast", "handler", "main"])
    t.thread(1, "redis-server")
    t.interval({(z, 1): (9000, 9, 0, 0), (pl, 1): (6000, 6, 0, 0)})
    b = load_trace(t.close())

    def sites(doc):
        return {
            tuple(f["function"] for f in s["frames"]): (s["in"], s["a_peak_live_bytes"], s["b_peak_live_bytes"])
            for s in doc["sites"]
        }

    assert sites(diff_traces(a, b)) == {
        ("createStringObject", "main"): ("both", 4096, 9000),
        ("pool_get", "handler", "main"): ("a", 5000, 0),
        ("pool_get_fast", "handler", "main"): ("b", 0, 6000),
        ("list_append", "main"): ("a", 800, 0),
    }
    doc = diff_traces(a, b, fold=A.parse_fold(["pool_get*"]))
    assert sites(doc) == {
        ("createStringObject", "main"): ("both", 4096, 9000),
        ("handler", "main"): ("both", 5000, 6000),
        ("list_append", "main"): ("a", 800, 0),
    }
    assert [f for f in doc["folded"] if f["from"] == "--fold"] == [
        {"pattern": "pool_get*", "from": "--fold", "functions": ["pool_get", "pool_get_fast"]}
    ]
    assert "pool_get, pool_get_fast [--fold pool_get*]" in diff_to_text(doc)
    r = CliRunner().invoke(diff, [a.path, b.path, "--fold", "pool_get*", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert sites(json.loads(r.stdout)) == sites(doc)


def test_pprof_follows_the_fold(trace):
    from reports.render.pprof import parse_pprof, to_pprof

    prof = parse_pprof(to_pprof(trace, fold=A.parse_fold(["pool_get"])))
    st = prof.string_table
    funcs = {f.id: st[f.name] for f in prof.function}
    locs = {loc.id: funcs[loc.line[0].function_id] for loc in prof.location}
    # createStringObject twice: its two stacks (via zmalloc and zcalloc) are two pprof locations.
    assert sorted((tuple(locs[i] for i in s.location_id), s.value[3]) for s in prof.sample) == [
        (("createStringObject", "main"), 1096),
        (("createStringObject", "main"), 3000),
        (("handler", "main"), 5000),
        (("list_append", "main"), 800),
    ]
