import json

import pytest
import soundfile
from omni_core.bench.dataset import BUILTIN_TEXTS, DatasetError, load_items, load_jsonl, spoken


def test_builtin_speech_prompts_need_no_files():
    items = load_items("speech", None)
    assert [i.text for i in items] == list(BUILTIN_TEXTS)


def test_spoken_audio_is_made_once_and_cached(tmp_path):
    path = spoken("Testing one two three.", tmp_path)
    info = soundfile.info(str(path))
    assert info.duration > 0.5 and info.samplerate > 8000
    before = path.stat().st_mtime_ns
    assert spoken("Testing one two three.", tmp_path) == path
    assert path.stat().st_mtime_ns == before
    assert list(tmp_path.iterdir()) == [path]  # no partial files left behind


def test_jsonl_resolves_relative_paths(tmp_path):
    audio = spoken("Hello.", tmp_path)
    (tmp_path / "sub").mkdir()
    dataset = tmp_path / "sub" / "data.jsonl"
    rows = [
        {"text": "clone me", "reference_audio": f"../{audio.name}", "reference_text": "Hello."},
        {"audio": str(audio), "text": "Hello."},
    ]
    dataset.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    speech = load_jsonl(dataset, "speech")[0]
    assert speech.reference_audio == (tmp_path / "sub" / f"../{audio.name}")
    assert speech.reference_audio.resolve() == audio.resolve()
    transcription = load_jsonl(dataset, "chat")[1]
    assert transcription.audio == audio and transcription.audio_seconds() > 0


@pytest.mark.parametrize(
    ("line", "endpoint", "message"),
    [
        ("not json", "speech", "data.jsonl:2: not JSON"),
        ("[1, 2]", "speech", "expected an object"),
        ('{"txt": "typo"}', "speech", "unknown fields \\['txt'\\]"),
        ('{"text": "no audio"}', "transcriptions", "needs 'audio'"),
        ('{"audio": "missing.wav"}', "transcriptions", "missing.wav does not exist"),
        ('{"text": "x", "reference_text": "y"}', "speech", "needs both reference_audio and reference_text"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, endpoint, message):
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("\n" + line + "\n")  # a blank first line: numbering still counts it
    with pytest.raises(DatasetError, match=message):
        load_jsonl(dataset, endpoint)


def test_empty_or_missing_dataset(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_jsonl(tmp_path / "nope.jsonl", "speech")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no rows"):
        load_jsonl(tmp_path / "empty.jsonl", "speech")
