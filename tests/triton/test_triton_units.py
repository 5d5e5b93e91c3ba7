"""tritonserver/ports.py on a hand-made /proc tree, tritonserver/textfiles.py's special tokens and tokenizer checks,
and tritonserver/templates.py's strict substitution -- each case's answer written out here."""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.export import genai_config
from wide_export.tritonserver import ports, textfiles
from wide_export.tritonserver.templates import placeholders, render, render_text, template_text

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(port: int, state: str, inode: str) -> str:
    return (f"   0: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  "
            f"1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def _proc(tmp_path: Path, tcp: str | None, tcp6: str | None = None, pids: dict | None = None) -> Path:
    """A /proc with net/tcp{,6} and, per pid, fd symlinks to `socket:[inode]` and a comm file."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    if tcp is not None:
        (proc / "net" / "tcp").write_text(HEADER + tcp)
    if tcp6 is not None:
        (proc / "net" / "tcp6").write_text(HEADER + tcp6)
    for pid, (comm, inodes) in (pids or {}).items():
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        for i, inode in enumerate(inodes):
            os.symlink(f"socket:[{inode}]" if inode != "file" else "/dev/null", fd / str(i))
        if comm is not None:
            (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / "self").mkdir()  # a non-pid entry
    return proc


def test_listening_inodes_only_of_listening_sockets_on_the_port(tmp_path):
    proc = _proc(tmp_path, _row(8000, "0A", "111") + _row(8000, "01", "222") + _row(8001, "0A", "333"),
                 _row(8000, "0A", "444"))
    assert ports.listening_inodes(8000, proc) == {"111", "444"}
    assert ports.listening_inodes(8001, proc) == {"333"}
    assert ports.listening_inodes(9, proc) == set()


def test_listening_inodes_with_one_table_or_none(tmp_path):
    assert ports.listening_inodes(8000, _proc(tmp_path / "a", None, _row(8000, "0A", "5"))) == {"5"}
    assert ports.listening_inodes(8000, _proc(tmp_path / "b", _row(8000, "0A", "6"))) == {"6"}
    assert ports.listening_inodes(8000, _proc(tmp_path / "c", None)) is None  # nothing readable
    short = _proc(tmp_path / "d", "   0: 0100007F:1F40 00000000:0000 0A 0\n")  # too few columns
    assert ports.listening_inodes(8000, short) == set()


def test_holders_and_ownership(tmp_path):
    proc = _proc(tmp_path, _row(8000, "0A", "111") + _row(8001, "0A", "333"),
                 pids={10: ("tritonserver", ["111", "file"]), 11: ("python", ["333"]), 12: (None, ["111"])})
    assert sorted(ports.holders(8000, proc)) == ["10 (tritonserver)", "12 (?)"]
    assert ports.holders(8001, proc) == ["11 (python)"]
    assert ports.holders(8002, proc) == []
    assert ports.owns_port([10], 8000, proc) is True
    assert ports.owns_port([11, 13], 8000, proc) is False  # someone else listens there
    assert ports.owns_port([10], 8002, proc) is False  # nobody does
    assert ports.owns_port([99], 8000, _proc(tmp_path / "x", None)) is True  # cannot tell: trusted
    assert ports._socket_inodes(10, proc) == {"111"}
    assert ports._socket_inodes(77, proc) == set()  # no such process


def test_check_ports_free_passes_free_and_unset_ports():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    ports.check_ports_free("127.0.0.1", {"--http-port": free, "--grpc-port": None})


def test_check_ports_free_refuses_a_port_given_twice():
    with pytest.raises(WideError) as err:
        ports.check_ports_free("127.0.0.1", {"--http-port": 8123, "--metrics-port": None, "--grpc-port": 8123})
    assert err.value.message.startswith("--grpc-port 8123 ") and "--http-port" in err.value.message
    assert "port" in err.value.hint


def test_check_ports_free_names_the_holder_or_says_it_cannot(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(WideError) as err:
            ports.check_ports_free("127.0.0.1", {"--grpc-port": port})
        msg = err.value.message
        assert msg.startswith(f"--grpc-port {port} on 127.0.0.1 ") and "already in use" in msg
        assert msg.endswith(f"{os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"), msg  # the holder
        assert "--grpc-port" in err.value.hint
        monkeypatch.setattr(ports, "holders", lambda port: [])
        with pytest.raises(WideError) as err:
            ports.check_ports_free("127.0.0.1", {"--http-port": port})
        assert err.value.message.endswith("cannot inspect)")  # no holder named: says it cannot tell


def test_an_address_that_is_not_ours():
    with pytest.raises(WideError) as err:
        ports.check_ports_free("192.0.2.1", {"--http-port": 0})
    assert "192.0.2.1:0" in err.value.message and "--address" in err.value.hint


def test_bindable_reuses_time_wait_and_tells_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert ports._bindable("127.0.0.1", taken.getsockname()[1]) is False
    assert ports._bindable("127.0.0.1", 0) is True



def test_listening_inodes_needs_the_inode_column(tmp_path):
    """A row is read when it has the inode (10th) column: one cut right before it is skipped, not a crash."""
    nine = "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0\n"
    ten = "   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 777\n"
    assert len(nine.split()) == 9 and len(ten.split()) == 10
    assert ports.listening_inodes(8000, _proc(tmp_path, nine + ten)) == {"777"}


def test_socket_inodes_skips_fd_entries_that_are_not_links(tmp_path):
    """An fd entry that cannot be read as a link (closed meanwhile) hides none of the sockets after it."""
    proc = _proc(tmp_path, "", pids={20: ("python", [])})
    fd = proc / "20" / "fd"
    for i in range(10):  # interleaved: unless a listing puts all ten plain files last, a socket follows one
        (fd / f"{2 * i}").write_text("")  # readlink fails on a plain file
        os.symlink(f"socket:[{500 + i}]", fd / f"{2 * i + 1}")
    assert ports._socket_inodes(20, proc) == {str(500 + i) for i in range(10)}


def test_check_ports_free_names_every_holder(monkeypatch):
    """A listening socket shared by several processes (a parent and the children that inherit it): all named."""
    monkeypatch.setattr(ports, "holders", lambda port: ["10 (tritonserver)", "12 (triton_python_backend_stub)"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(WideError) as err:
            ports.check_ports_free("127.0.0.1", {"--http-port": port})
    assert err.value.message.startswith(f"--http-port {port} ")
    assert err.value.message.endswith("10 (tritonserver), 12 (triton_python_backend_stub)"), err.value.message


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_check_ports_free_on_an_ipv6_address():
    """An IPv6 --address is checked as IPv6: a free port passes, a taken one is named as taken."""
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(WideError) as err:
            ports.check_ports_free("::1", {"--grpc-port": port})
        assert err.value.message.startswith(f"--grpc-port {port} on ::1 is already in use")
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        free = probe.getsockname()[1]
    ports.check_ports_free("::1", {"--http-port": free})


def test_an_address_that_is_not_ours_says_why_in_words():
    """The refusal gives the OS's reason text (strerror), not Python's '[Errno N] ...' form."""
    with pytest.raises(WideError) as err:
        ports.check_ports_free("192.0.2.1", {"--http-port": 0})
    assert "192.0.2.1:0" in err.value.message and "Errno" not in err.value.message
    assert err.value.message.endswith(f": {os.strerror(errno.EADDRNOTAVAIL)}"), err.value.message


# -- special tokens and tokenizer files
def _write(folder: Path, **files) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name.replace("__", ".")).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


@pytest.mark.parametrize("gen, genai, expected", [
    ({"eos_token_id": [5, 6]}, None, {"eos_token_ids": [5, 6], "pad_token_id": 5}),  # pad: the first eos
    ({"eos_token_id": 7, "pad_token_id": 0}, None, {"eos_token_ids": [7], "pad_token_id": 0}),
    (None, {"model": {"eos_token_id": [3], "pad_token_id": 4}}, {"eos_token_ids": [3], "pad_token_id": 4}),
    ({"eos_token_id": 2}, {"model": {"eos_token_id": [3], "pad_token_id": 4}},
     {"eos_token_ids": [2], "pad_token_id": 4}),  # eos from generation_config, pad from genai_config
    ({"pad_token_id": 1}, {"model": {"eos_token_id": 8}}, {"eos_token_ids": [8], "pad_token_id": 1}),
    ({"eos_token_id": None}, {"model": {"eos_token_id": 9}}, {"eos_token_ids": [9], "pad_token_id": 9}),
    (None, None, {"eos_token_ids": [], "pad_token_id": 0}),
])
def test_generation_tokens(tmp_path, gen, genai, expected):
    files = {}
    if gen is not None:
        files["generation_config__json"] = gen
    if genai is not None:
        files["genai_config__json"] = genai
    assert textfiles.generation_tokens(_write(tmp_path / "f", **files), 16) == expected


@pytest.mark.parametrize("gen, words", [
    ({"eos_token_id": [1, True]}, "eos_token_id must be a token id or a list of them, got [1, True]"),
    ({"eos_token_id": -1}, "eos_token_id must be a token id or a list of them, got -1"),
    ({"eos_token_id": "2"}, "got '2'"),
    ({"eos_token_id": 2, "pad_token_id": 1.5}, "pad_token_id must be a token id or a list of them, got 1.5"),
])
def test_bad_special_tokens(tmp_path, gen, words):
    with pytest.raises(WideError, match=None) as err:
        textfiles.generation_tokens(_write(tmp_path / "f", generation_config__json=gen), 16)
    assert words in err.value.message


def test_special_tokens_outside_the_vocabulary(tmp_path):
    folder = _write(tmp_path / "f", generation_config__json={"eos_token_id": [3, 16]})
    with pytest.raises(WideError) as err:
        textfiles.generation_tokens(folder, 16)
    assert err.value.message.startswith(f"{folder}: ") and "token id 16 " in err.value.message
    assert "vocabulary of 16" in err.value.message and "generation_config.json" in err.value.hint
    assert textfiles.generation_tokens(folder, 17)["eos_token_ids"] == [3, 16]
    padded = _write(tmp_path / "g", generation_config__json={"eos_token_id": 3, "pad_token_id": 20})
    with pytest.raises(WideError, match="eos/pad token id 20"):
        textfiles.generation_tokens(padded, 16)


def test_settings_that_are_not_an_object(tmp_path):
    folder = _write(tmp_path / "f", generation_config__json=[1, 2])
    with pytest.raises(WideError) as err:
        textfiles.generation_tokens(folder, 16)
    assert err.value.message.startswith(f"{folder / 'generation_config.json'}: ") and "JSON object" in err.value.message
    _write(tmp_path / "g", generation_config__json="{broken")
    with pytest.raises(WideError):
        textfiles.generation_tokens(tmp_path / "g", 16)


def _tokenizer(folder: Path, words: int) -> Path:
    from tokenizers import Tokenizer, models

    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(words)}, unk_token="w0")).save(
        str(folder / "tokenizer.json"))
    return folder


def test_check_tokenizer_sizes(tmp_path):
    assert textfiles.check_tokenizer(tmp_path, 10) is None  # no tokenizer.json
    folder = _tokenizer(tmp_path / "t", 12)
    assert textfiles.check_tokenizer(folder, 12) == 12
    with pytest.raises(WideError) as err:
        textfiles.check_tokenizer(folder, 11)
    msg = err.value.message
    assert msg.startswith(f"{folder / 'tokenizer.json'} ") and "12 tokens" in msg and msg.endswith(" 11"), msg
    assert "tokenizer" in err.value.hint
    (folder / "tokenizer.json").write_text("not json")
    with pytest.raises(WideError) as err:
        textfiles.check_tokenizer(folder, 12)
    assert err.value.message.startswith(f"cannot load {folder / 'tokenizer.json'}: ")
    assert "\n" not in err.value.message and err.value.hint.startswith("copy the model's tokenizer files")
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(WideError, match="cannot load"):
        textfiles.check_tokenizer(folder, 12)


def test_a_tokenizer_over_the_json_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """tokenizer.json was parsed whole before any size check (a hostile 1 GB file filled memory)."""
    import wide_export.base.paths as paths

    folder = _tokenizer(tmp_path / "t", 12)
    size = (folder / "tokenizer.json").stat().st_size
    monkeypatch.setattr(paths, "JSON_MAX_BYTES", size - 1)
    import tokenizers

    monkeypatch.setattr(tokenizers.Tokenizer, "from_str", lambda *a: pytest.fail("parsed before the size check"))
    with pytest.raises(WideError) as err:
        textfiles.check_tokenizer(folder, 12)
    msg = err.value.message
    assert str(folder / "tokenizer.json") in msg and f"{size} bytes" in msg and f"than the {size - 1} " in msg, msg
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    with pytest.raises(WideError, match="outside"):
        textfiles.check_tokenizer(folder, 12)


def test_serving_files_present_and_confined(tmp_path):
    folder = _write(tmp_path / "f", tokenizer__json="{}", generation_config__json="{}")
    assert sorted(p.name for p in genai_config.serving_files(folder)) == ["generation_config.json", "tokenizer.json"]
    assert all(p.parent == folder for p in genai_config.serving_files(folder))
    outside = _write(tmp_path / "elsewhere", tokenizer_config__json="{}")
    os.symlink(outside / "tokenizer_config.json", folder / "tokenizer_config.json")
    with pytest.raises(WideError):
        genai_config.serving_files(folder)


# -- templates
def test_placeholders_named_and_braced():
    assert placeholders("a $x ${y} $$z ${x}") == {"x", "y"}
    assert placeholders("no placeholders $$") == set()
    with pytest.raises(ValueError, match="malformed placeholder at offset 2"):
        placeholders("a $ b")


def test_render_text_is_strict():
    assert render_text("$a-${b}", {"a": 1, "b": "two"}) == "1-two"
    assert render_text("$f", {"f": 0.5}) == "0.5"
    with pytest.raises(KeyError) as err:
        render_text("$a $b", {"a": 1, "c": 2}, what="config.pbtxt")
    said = str(err.value)
    assert "config.pbtxt" in said and "missing values ['b']" in said and "unknown keys ['c']" in said, said
    with pytest.raises(TypeError, match=r"^t: .*'a'.*got bool$"):
        render_text("$a", {"a": True}, what="t")
    with pytest.raises(TypeError, match="got list"):
        render_text("$a", {"a": [1]})
    with pytest.raises(KeyError, match="template: missing"):
        render_text("$a", {})


def test_shipped_templates_render_with_their_own_keys():
    names = [p.name for p in (Path(__file__).resolve().parents[2] / "wide_export" / "tritonserver" / "templates").iterdir()
             if p.is_file() and not p.name.endswith(".py")]
    assert names
    for name in names:
        text = template_text(name)
        keys = placeholders(text)
        out = render(name, **{k: f"<{k}>" for k in keys})
        assert all(f"<{k}>" in out for k in keys)
        with pytest.raises(KeyError, match=name):
            render(name, **{k: "v" for k in keys}, extra_key_nobody_uses="v")


# -- sources: what a repository is generated from
from wide_export.tritonserver import export_folder as sources  # noqa: E402

CFG = {"num_layers": 2, "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 100, "dtype": "float16",
       "max_position_embeddings": 64}


def test_parse_model_shape_fields_and_aliases(tmp_path):
    where = tmp_path / "wide_config.json"
    assert sources.parse_model_shape(CFG, where) == sources.ModelShape(2, 4, 8, 100, "float16", 64)
    alias = {**{k: v for k, v in CFG.items() if k not in ("num_layers", "dtype")}, "num_hidden_layers": 3}
    shape = sources.parse_model_shape(alias, where)
    assert shape.num_layers == 3 and shape.kv_dtype == "float32"  # no dtype: float32
    assert sources.parse_model_shape({**CFG, "num_hidden_layers": 9}, where).num_layers == 2  # num_layers first
    assert sources.parse_model_shape({**CFG, "num_key_value_heads": 1}, where).num_kv_heads == 1  # 1 is positive


@pytest.mark.parametrize("field, value", [("head_dim", 0), ("head_dim", -1), ("vocab_size", True),
                                          ("num_key_value_heads", 2.0), ("num_layers", "2"),
                                          ("max_position_embeddings", 0)])
def test_integer_fields_must_be_positive_integers(tmp_path, field, value):
    with pytest.raises(WideError) as err:
        sources.parse_model_shape({**CFG, field: value}, tmp_path / "c.json")
    assert err.value.message.startswith(f"{tmp_path / 'c.json'}: {field} ")
    assert err.value.message.endswith(f"got {value!r}") and "positive integer" in err.value.message


def test_missing_fields_and_non_objects(tmp_path):
    with pytest.raises(WideError) as err:
        sources.parse_model_shape({k: v for k, v in CFG.items() if k != "num_layers"}, tmp_path / "c.json")
    assert err.value.message.startswith(f"{tmp_path / 'c.json'}: ") and "'num_layers'" in err.value.message
    assert "wide-export onnx" in err.value.hint
    with pytest.raises(WideError, match="expected a JSON object"):
        sources.parse_model_shape([1], tmp_path / "c.json")


@pytest.mark.parametrize("raw, name", [("fp32", "float32"), ("FLOAT", "float32"), ("fp16", "float16"),
                                       ("half", "float16"), ("Float16", "float16"), ("float32", "float32")])
def test_kv_dtype_names(tmp_path, raw, name):
    assert sources.kv_dtype_name(raw, tmp_path) == name


@pytest.mark.parametrize("raw", ["bfloat16", "bf16", "BF16"])
def test_bfloat16_is_refused_with_the_way_to_serve_it(tmp_path, raw):
    with pytest.raises(WideError) as err:
        sources.kv_dtype_name(raw, tmp_path)
    assert err.value.message.startswith(f"{tmp_path}: ") and "bfloat16" in err.value.message
    assert "--dtype float16" in err.value.hint and "--fp16" in err.value.hint


def test_other_dtypes_are_refused(tmp_path):
    with pytest.raises(WideError) as err:
        sources.kv_dtype_name("int8", tmp_path)
    assert err.value.message.startswith(f"{tmp_path}: ") and "'int8'" in err.value.message
    assert "--dtype" in err.value.hint


def test_errors_of_parse_model_shape_name_the_file(tmp_path):
    """A refused dtype or length limit found while parsing names the description's path."""
    where = tmp_path / "wide_config.json"
    with pytest.raises(WideError) as err:
        sources.parse_model_shape({**CFG, "dtype": "int8"}, where)
    assert err.value.message.startswith(f"{where}: ") and "'int8'" in err.value.message
    with pytest.raises(WideError) as err:  # float16, 256 bytes per position (test_limits_by_hand)
        sources.parse_model_shape({**CFG, "max_position_embeddings": 1 << 40}, where)
    assert err.value.message.startswith(f"{where}: max_position_embeddings {1 << 40} ")
    assert "256 TiB" in err.value.message


def test_limits_by_hand(tmp_path):
    # float16: 2 (k, v) * 2 layers * 4 heads * 8 dims * 2 bytes = 256 bytes per position
    ok = sources.ModelShape(2, 4, 8, 100, "float16", (1 << 40) // 256)
    sources.check_limits(ok, tmp_path)
    with pytest.raises(WideError) as err:
        sources.check_limits(sources.ModelShape(2, 4, 8, 100, "float16", (1 << 40) // 256 + 1), tmp_path)
    msg = err.value.message
    assert msg.startswith(f"{tmp_path}: max_position_embeddings {(1 << 40) // 256 + 1} ") and "1 TiB" in msg, msg
    assert DAMAGED in err.value.hint
    sources.check_limits(sources.ModelShape(2, 4, 8, 100, "float32", (1 << 40) // 512), tmp_path)  # 4 bytes each
    with pytest.raises(WideError, match="max_position_embeddings"):  # float32: twice the bytes
        sources.check_limits(sources.ModelShape(2, 4, 8, 100, "float32", (1 << 40) // 256), tmp_path)
    sources.check_limits(sources.ModelShape(1, 1, 1, 2**31 - 1, "float32", 1), tmp_path)
    with pytest.raises(WideError) as err:
        sources.check_limits(sources.ModelShape(1, 1, 1, 2**31, "float32", 1), tmp_path)
    msg = err.value.message
    assert msg.startswith(f"{tmp_path}: vocab_size {2**31} ") and f"({2**31 - 1})" in msg, msg
    assert DAMAGED in err.value.hint


DAMAGED = "wide-export onnx"  # what the limits' hint names


def test_check_vocab():
    shape = sources.ModelShape(1, 1, 1, 100, "float32", 8)
    sources.check_vocab(shape, ["batch", "seq", 100], "g")
    sources.check_vocab(shape, ["batch", "seq", None], "g")  # dynamic: not checked
    sources.check_vocab(shape, [], "g")
    sources.check_vocab(shape, [-1], "g")
    sources.check_vocab(shape, [0], "g")  # not a width: unchecked
    with pytest.raises(WideError, match="logits have 1 values per token"):
        sources.check_vocab(shape, [1, 1, 1], "g")
    with pytest.raises(WideError) as err:
        sources.check_vocab(shape, [1, 1, 99], "g")
    msg = err.value.message
    assert msg.startswith("g: ") and "99 values per token" in msg and "vocab_size 100" in msg, msg
    assert "re-export" in err.value.hint


def test_check_io_names_names_what_is_missing_and_extra():
    io = sources.DEFAULT_IO
    ins = ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key", "past_key_values.0.value"]
    outs = ["logits", "present.0.key", "present.0.value"]
    sources.check_io_names(ins, outs, 1, io, "g")
    with pytest.raises(WideError) as err:
        sources.check_io_names(ins[:-1] + ["x"], outs, 1, io, "g")
    msg = err.value.message
    assert msg.startswith("g: inputs ") and "for 1 layers" in msg, msg
    assert "missing ['past_key_values.0.value']" in msg and "unexpected ['x']" in msg, msg
    assert "wide-export onnx" in err.value.hint
    with pytest.raises(WideError) as err:
        sources.check_io_names(ins, outs[:1], 1, io, "g")
    assert "outputs do not match" in err.value.message and "'present.0.key', 'present.0.value'" in err.value.message
    many = [f"e{i}" for i in range(6)]
    with pytest.raises(WideError) as err:
        sources.check_io_names(ins + many, outs, 1, io, "g")
    assert "unexpected ['e0', 'e1', 'e2', 'e3'])" in err.value.message  # four at most
    with pytest.raises(WideError) as err:
        sources.check_io_names([], outs, 1, io, "g")  # five missing: the first four named
    assert "missing ['attention_mask', 'input_ids', 'past_key_values.0.key', 'past_key_values.0.value']" \
           in err.value.message  # sorted, four at most


def test_count_layers():
    names = ["past_key_values.0.key", "past_key_values.1.key", "past_key_values.1.value", "past_key_values.x.key",
             "past_key_values.10.key", "xpast_key_values.2.key"]
    assert sources.count_layers(names, "past_key_values.{i}.key") == 3
    assert sources.count_layers(["a.b"], "a.{i}") == 0


def test_config_io_must_agree_with_the_graph(tmp_path):
    sources._check_config_io({}, ["a"], ["b"], tmp_path)
    sources._check_config_io({"io": "not a dict"}, ["a"], ["b"], tmp_path)
    sources._check_config_io({"io": {"inputs": [{"name": "a"}], "outputs": []}}, ["a"], ["b"], tmp_path)
    with pytest.raises(WideError) as err:
        sources._check_config_io({"io": {"inputs": [{"name": "a"}, {"name": "c"}]}}, ["a"], ["b"], tmp_path)
    assert err.value.message.startswith(f"{tmp_path}: io.inputs ")
    with pytest.raises(WideError, match="io.outputs does not match"):
        sources._check_config_io({"io": {"outputs": [{"name": "z"}, "junk"]}}, ["a"], ["b"], tmp_path)
