"""Models panel: the table from `wslm models list --json`, a download from the loopback hub with live
progress, cancel and resume, then delete. Real `wslm` processes, real HTTP, a private HF cache."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("PySide6")

from hub_server import FakeHub, make_tiny_gguf  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.download_job import CANCELLED, DONE, RUNNING  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.models_model import fit_hint  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

REPO = "org/tiny-gguf"


@pytest.fixture
def env(tmp_path, monkeypatch):
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return tmp_path


@pytest.mark.timeout(300)
def test_models_panel_download_cancel_resume_delete(qtbot, env):
    # Padded to 400 KB so that, throttled, the download lasts long enough to watch and cancel.
    q4 = make_tiny_gguf(env / "src" / "tiny-Q4_K_M.gguf", "Q4_K_M").read_bytes() + bytes(400_000)
    q8 = make_tiny_gguf(env / "src" / "tiny-Q8_0.gguf", "Q8_0").read_bytes()
    with FakeHub() as hub:
        hub.add_repo(REPO, {"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "README.md": b"# tiny\n"})
        hub.rate_bps = 100_000  # ~4 s
        window = MainWindow(Settings(first_run_done=True), ChatStore(env / "c.sqlite3"), watch=False)
        qtbot.addWidget(window)
        window.show()
        window.sidebar.select("models")
        panel = window.models_panel
        table = window.models.table
        qtbot.waitUntil(lambda: not window.models.loading, timeout=60_000)
        assert "demo" in table.ids(), panel.error.text()
        assert "on disk" in panel.summary.text()

        dialog = panel.open_download()
        dialog.repo.setText(REPO)
        dialog.pattern.setText("*Q4_K_M.gguf")
        dialog.endpoint.setText(hub.url)
        dialog.start_button.click()
        job = dialog.job
        assert job is not None and job.running
        qtbot.waitUntil(lambda: job.progress.bytes > 0, timeout=60_000)
        view = panel.downloads.itemAt(0).widget()
        qtbot.waitUntil(lambda: view.total_bar.value() > 0, timeout=10_000)
        assert view.cancel_button.isVisible() and "tiny-Q4_K_M.gguf" in view.file_label.text()
        assert job.progress.state == RUNNING and job.progress.total_bytes >= len(q4)

        view.cancel_button.click()
        qtbot.waitUntil(lambda: job.progress.state == CANCELLED, timeout=30_000)
        assert view.resume_button.isVisible() and not view.cancel_button.isVisible()
        assert "Resume" in view.info.text()

        hub.rate_bps = None
        with qtbot.waitSignal(job.finished, timeout=60_000) as done:
            view.resume_button.click()
        assert done.args[0] == DONE, job.progress.message
        assert view.total_bar.value() == 1000
        # Only the file the pattern picked was fetched.
        assert not hub.file_requests("tiny-Q8_0.gguf")
        qtbot.waitUntil(lambda: any("tiny-gguf" in i for i in table.ids()), timeout=60_000)
        row = next(i for i, m in enumerate(table.models) if "tiny-gguf" in m["id"])
        assert table.data(table.index(row, 3)) == "gguf"

        panel.table.selectRow(row)
        panel._delete_selected(confirm=False)
        qtbot.waitUntil(lambda: not any("tiny-gguf" in i for i in table.ids()) and not window.models.loading,
                        timeout=60_000)
        window.close()


def test_fit_hint():
    gib = 2**30
    assert fit_hint({"memory_estimate_bytes": 2 * gib}, 8 * gib)[0] == "yes"
    assert fit_hint({"memory_estimate_bytes": 7 * gib}, 8 * gib)[0] == "tight"
    assert fit_hint({"memory_estimate_bytes": 9 * gib}, 8 * gib)[0] == "no"
    assert fit_hint({"memory_estimate_bytes": 2 * gib}, None)[0] == "unknown"
    assert fit_hint({"supported": False}, 8 * gib)[0] == "unsupported"


def test_models_list_failure_names_the_fix(qtbot, tmp_path, monkeypatch):
    """A WSL distro without wslm (fake wsl.exe, nothing on its PATH): the panel says so and how to fix it."""
    from fake_windows import use

    use(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    window = MainWindow(Settings(first_run_done=True, target={"kind": "wsl", "distro": "Ubuntu"}),
                        ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    window.show()
    window.sidebar.select("models")
    with qtbot.waitSignal(window.models.failed, timeout=60_000) as failed:
        pass
    assert "WSL distro Ubuntu" in failed.args[0] and "install" in failed.args[0].lower()
    assert window.models_panel.error.isVisible() and "install.sh" in window.models_panel.error.text()
    window.close()


@pytest.mark.timeout(200)
def test_discover_searches_the_hub_and_downloads_a_file(qtbot, env):
    from wslm.gui.discover_dialog import fit_verdict, recommended

    q4 = make_tiny_gguf(env / "src" / "tiny-Q4_K_M.gguf", "Q4_K_M").read_bytes()
    q8 = make_tiny_gguf(env / "src" / "tiny-Q8_0.gguf", "Q8_0").read_bytes()
    with FakeHub() as hub:
        hub.add_repo(REPO, {"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "README.md": b"# tiny\n"})
        hub.add_repo("org/notes-only", {"README.md": b"# no weights\n"})
        window = MainWindow(Settings(first_run_done=True), ChatStore(env / "c.sqlite3"), watch=False)
        qtbot.addWidget(window)
        window.show()
        panel = window.models_panel
        qtbot.waitUntil(lambda: not window.models.loading, timeout=60_000)
        window.models.table.set_vram(8 << 30, 0.9)
        dialog = panel.open_discover()
        assert "Recommended for this machine" in dialog.picks.text()
        dialog.query.setText("org/")
        # The dialog's own Mirror endpoint field: checked, named in a failure, remembered once used.
        dialog.mirror.setText("hf-mirror.com")
        dialog.search()
        assert "http://" in dialog.status.text() and "Mirror endpoint" in dialog.status.text()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        dialog.mirror.setText(dead)
        dialog.search()
        qtbot.waitUntil(lambda: "⚠" in dialog.status.text(), timeout=60_000)
        assert dead in dialog.status.text() and "“Mirror endpoint” above" in dialog.status.text()
        dialog.mirror.setText(hub.url)
        dialog.search()
        assert window.settings.hub_endpoint == hub.url
        qtbot.waitUntil(lambda: dialog.list.count() > 0 or "⚠" in dialog.status.text(), timeout=60_000)
        # Through the mirror; only repos with weights the engine loads; each GGUF file with quant, size, fit.
        assert any("/api/models" in r.path and "search=org" in r.path for r in hub.requests), dialog.status.text()
        assert [m["id"] for m in dialog.results] == [REPO]
        rows = {dialog.files.item(r, 1).text(): dialog.files.item(r, 3).text() for r in range(dialog.files.rowCount())}
        assert rows == {"Q4_K_M": "fits GPU", "Q8_0": "fits GPU"}
        dialog.files.selectRow([dialog.files.item(r, 1).text() for r in range(2)].index("Q8_0"))
        dialog.download_button.click()
        job = panel.jobs[-1]
        assert job.file_pattern == "tiny-Q8_0.gguf" and job.endpoint == hub.url
        qtbot.waitUntil(lambda: job.progress.state == DONE, timeout=60_000)
        qtbot.waitUntil(lambda: any(REPO in i for i in window.models.table.ids()), timeout=60_000)
    assert fit_verdict(20 << 30, 8 << 30, 0.9, 64 << 30)[0] == "too big for GPU · fits RAM"
    assert fit_verdict(20 << 30, None, 0.9, 16 << 30)[0] == "too big"
    assert "Qwen/Qwen3-8B-GGUF" in recommended(16 << 30, 32 << 30)
    assert "Qwen/Qwen3-8B-GGUF" not in recommended(None, 8 << 30)
