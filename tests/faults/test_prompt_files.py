"""Prompt files: regular files only, a size cap, streamed reads; never a hang on a FIFO or a read of a device."""

from __future__ import annotations

import os
import random
import tracemalloc
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import prompts
from orchestrator.errors import PromptFileError
from tests.conftest import FAST_SIM, WriteProfile, free_port
from tests.faults.support import FAST, assert_plain, run

PROFILE = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "ready_timeout_s": 30, "sim": FAST_SIM}


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO with no writer would block the open (and then the read) forever: refused before either, exit 2. The
    subprocess timeout only bounds a hang; it asserts no speed."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text(yaml.safe_dump({**PROFILE, "port": free_port()}))
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    out = run("bench", "p", "--sim", "--prompts", str(fifo), *FAST, "--db", str(tmp_path / "r.db"), cwd=tmp_path,
              timeout=120)  # fmt: skip
    assert out.rc == 2, out.text
    assert f"{fifo}: not a regular file but a FIFO" in out.err and "a prompt file is a JSONL file on disk" in out.err
    assert "launched" not in out.text
    assert_plain(out.text)
    # A bundle is read the same way: `orch import FIFO` refuses instead of waiting for a writer.
    shown = run("import", str(fifo), "--db", str(tmp_path / "r.db"), cwd=tmp_path, timeout=120)
    assert shown.rc == 2 and "not a regular file but a FIFO" in shown.err and "not a result bundle" in shown.err
    assert_plain(shown.text)


def test_a_device_or_directory_is_refused_before_reading(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/dev/zero never ends: a device is refused by what it is, not by what reading it gives. /dev/null (which ends at
    once, so the test cannot run away) stands for it."""
    path = write_profile("p", **{**PROFILE, "port": free_port()})
    for source, kind in (("/dev/null", "a device"), (str(tmp_path), "a directory")):
        assert main(["bench", str(path), "--sim", "--prompts", source, "--db", str(tmp_path / "r.db")]) == 2
        err = capsys.readouterr().err
        assert f"{source}: not a regular file but {kind}; a prompt file is a JSONL file on disk" in err, err
        assert "Traceback" not in err


def test_a_file_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    """A sparse file (no disk used) one byte over the cap: refused by its size, in the words profiles and bundles
    use, before a byte is read."""
    big = tmp_path / "big.jsonl"
    big.touch()
    os.truncate(big, prompts.MAX_FILE_BYTES + 1)
    cap = f"larger than {prompts.MAX_FILE_BYTES // 2**20} MiB; is this really a prompt file?"
    with pytest.raises(PromptFileError, match=cap.replace("?", r"\?")):
        prompts.request_sequence(str(big), 1, seed=0)
    with pytest.raises(PromptFileError, match=cap.replace("?", r"\?")):
        prompts.load_jsonl(str(big))


def test_a_line_over_the_record_cap_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """A 250 MB single line was read whole (1.8 GB, then the server's 413). A line is read with a limit: one longer
    than a record may be (16 MiB: a prompt of the most tokens orch sends is a few MB) is refused after reading that
    much, naming the file and line. The memory bound is far above what the read needs and far below the line."""
    big = tmp_path / "p.jsonl"
    with big.open("wb") as f:
        f.write(b'{"prompt": "ok"}\n{"prompt": "')
        f.write(b"x" * (6 * prompts.MAX_RECORD_BYTES))
        f.write(b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(PromptFileError, match=r"p\.jsonl:2: a line longer than 16 MiB; a line of a prompt file is"):
            prompts.request_sequence(str(big), 1, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * prompts.MAX_RECORD_BYTES, peak  # about 2x: the read and its copy


def test_a_large_set_is_sampled_as_the_whole_pool_would_be(tmp_path: Path) -> None:
    """Streaming keeps only the chosen prompts, yet sends exactly what shuffling the whole pool sends (the recorded
    requests_sha256 of older experiments depends on it), blank lines, CRLF and U+2028 in a prompt included."""
    f = tmp_path / "p.jsonl"
    lines = [
        '{"prompt": "a\u2028b"}',
        "",
        '{"prompt": "two", "category": "x"}\r',
        '{"messages": [{"role": "user", "content": "three"}]}',
    ]
    lines += [f'{{"prompt": "p{i}"}}' for i in range(40)]
    f.write_text("\n".join(lines), encoding="utf-8")
    pool = prompts.load_jsonl(str(f))
    assert len(pool) == 43 and pool[0].text == "a\u2028b"
    for n, seed in ((1, 0), (43, 3), (100, 7)):
        rng = random.Random(f"prompts:{seed}")
        order: list[prompts.PromptItem] = []
        while len(order) < n:
            batch = pool[:]
            rng.shuffle(batch)
            order.extend(batch)
        assert prompts.request_sequence(str(f), n, seed=seed) == order[:n]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2: needs \"prompt\""):
        prompts.request_sequence(str(tmp_path / "bad.jsonl"), 1, seed=0)


def test_a_profile_or_hosts_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Profiles and hosts files are YAML read through the same opening as prompt files: a FIFO named as one is
    refused (exit 2, naming it) instead of blocking orch until someone writes to it."""
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    out = run("profiles", "show", str(fifo), cwd=tmp_path, timeout=120)
    assert out.rc == 2, out.text
    assert f"{fifo}: not a regular file but a FIFO (named pipe); a profile is a YAML file on disk" in out.err, out.err
    assert_plain(out.text)
    hosts = tmp_path / "hosts.yaml"
    os.mkfifo(hosts)
    out = run("hosts", "list", "--inventory", str(hosts), cwd=tmp_path, timeout=120)
    assert out.rc == 2, out.text
    assert f"{hosts}: not a regular file but a FIFO (named pipe)" in out.err, out.err
    assert_plain(out.text)
