"""Reading a user's JSON file with limits: what passes unchanged, what becomes a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gputrain.jsonfile import MAX_INT, JsonFileError, read_json


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "facts.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_ordinary_json_reads_as_json_loads_would(tmp_path: Path) -> None:
    text = ('{"a": [1, -2, 3.5, null, true, "GPU \\ud83d\\ude00"], '
            f'"b": {{"c": {MAX_INT}, "d": {-MAX_INT}}}}}')
    assert read_json(write(tmp_path, text)) == {
        "a": [1, -2, 3.5, None, True, "GPU 😀"], "b": {"c": MAX_INT, "d": -MAX_INT}}


def test_a_byte_order_mark_is_allowed(tmp_path: Path) -> None:
    assert read_json(write(tmp_path, b'\xef\xbb\xbf{"a": 1}')) == {"a": 1}


def test_lone_surrogates_are_written_out_in_keys_values_and_deep_inside(tmp_path: Path) -> None:
    text = '{"k\\udc80": ["\\ud800 H200", {"x": "\\udfff"}], "ok": "fine"}'
    data = read_json(write(tmp_path, text))
    assert data == {"k\\udc80": ["\\ud800 H200", {"x": "\\udfff"}], "ok": "fine"}
    assert list(data) == ["k\\udc80", "ok"]  # order kept
    printed = "".join([*data, data["k\\udc80"][0], data["k\\udc80"][1]["x"]])
    assert printed.encode("utf-8")  # no UnicodeEncodeError: it can go to any UTF-8 output


@pytest.mark.parametrize(("content", "message"), [
    ("[" * 50_000 + "]" * 50_000, "arrays or objects are nested too deeply to read"),
    ("[" + str(MAX_INT + 1) + "]", "the integer '9223372036854775809' is out of range"),
    ("[-" + "9" * 100 + "]", "the integer '-999999999999999999999999999999999999999'..."),
    ('{"a": Infinity}', "Infinity is not a JSON number"),
    ('{"a": 1e400}', "the number '1e400' is too large for a float (it would be infinity)"),
    ('{"a": [1.0, -2E+308]}', "the number '-2E+308' is too large for a float"),
    ('{"a": ' + "1" * 400 + '.0}', "the number '1111111111111111111111111111111111111111'..."),
    ("[1,", "not valid JSON: Expecting value: line 1 column 4 (char 3)"),
    (b'{"a": "\xff"}', "not UTF-8 text (byte 7 is 0xff)"),
], ids=["deep", "int64+1", "100-digits", "infinity", "1e400", "-2e308", "400-digit-float",
        "cut-short", "latin-1"])
def test_what_json_loads_would_crash_on_or_accept_wrongly_is_an_error_naming_the_file(
        tmp_path: Path, content: str | bytes, message: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(JsonFileError) as raised:
        read_json(path)
    assert str(raised.value).startswith(f"{path}: {message}")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(JsonFileError, match="no such file"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(JsonFileError, match="cannot be read: Is a directory"):
        read_json(tmp_path)


def test_numbers_within_range_read_on_json_s_fast_path(tmp_path: Path) -> None:
    """Long digit runs inside strings send the file to the checked path, which agrees."""
    for text in ('{"a": [1, -22, 9223372036854775807, 1.5e300, 2.5e-400]}',
                 '{"id": "run 12345678901234567890", "a": [1, 1.5e300]}'):
        data = read_json(write(tmp_path, text))
        assert data["a"][0] == 1 and isinstance(data["a"][0], int)
