"""ChatPanel's connection and model switching: where the chat sends (our server or a URL), the picker's
choices (our server switches to the model: a pool load or a restart), a switch's and a load's progress,
and ejecting a model from the server's pool.

A mixin of ChatPanel: it uses the panel's session, settings, header (picker, connection dot), notes and
signals."""

from __future__ import annotations

import html
from collections.abc import Callable

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.model_lister import ModelLister
from wslm.gui.models_model import display_name

SWITCH_STEPS = {"stopping": "stopping the current model", "stopped": "stopped", "starting": "starting the server",
                "loading": "loading the model"}


class ModelSwitching:
    def _init_switching(self) -> None:
        self.server_url = ""  # set by the main window while our server is ready
        self.server_model = ""
        self.server_context: int | None = None  # its max_model_len: replies are kept within it
        self.server_key = ""
        self.serve_choice = ""  # the server panel's model (what a start would load)
        self.switching_to = ""  # a model switch in progress
        # Set by the main window: whether our server switches to a model without a restart (its model pool
        # holds it), so a switch leaves the replies being written alone.
        self.live_switch: Callable[[str], bool] = lambda model_id: False
        self.lister = ModelLister(self)
        self.lister.listed.connect(self._set_models)
        self.lister.failed.connect(self._show_error)
        self.picker.chosen.connect(self._picked)
        self.picker.opening.connect(self.picker_opened)
        self.picker.eject_wanted.connect(self.eject_model)
        self.model_combo.currentTextChanged.connect(self._model_changed)

    # What the main window sets: passed on to the picker
    @property
    def installed(self) -> list[dict]:
        return self.picker.installed

    @property
    def model_files(self) -> list[str]:
        return self.picker.model_files

    @property
    def loaded_models(self) -> set[str]:
        return self.picker.loaded_models

    @property
    def loading_model(self) -> str:
        return self.picker.loading_model

    @property
    def can_eject(self) -> Callable[[str], bool]:
        """Whether our server can eject a model now (one its pool loaded, not the one it started with)."""
        return self.picker.can_eject

    @can_eject.setter
    def can_eject(self, fn: Callable[[str], bool]) -> None:
        self.picker.can_eject = fn

    @property
    def server_path(self) -> Callable[[str], str]:
        """A chosen file's path as the server sees it (WSL: /mnt/c/…)."""
        return self.picker.server_path

    @server_path.setter
    def server_path(self, fn: Callable[[str], str]) -> None:
        self.picker.server_path = fn

    @property
    def choose_model_file(self) -> Callable[[], str]:
        return self.picker.choose_model_file

    @choose_model_file.setter
    def choose_model_file(self, fn: Callable[[], str]) -> None:
        self.picker.choose_model_file = fn

    # The connection
    def set_server(self, url: str, model: str, api_key: str, context_len: int | None = None) -> None:
        """Called when our server becomes ready (url "") when it stops. context_len: its max_model_len."""
        self.server_url, self.server_model, self.server_key = url, model, api_key
        self.server_context = context_len
        self._apply_connection()
        self.update_context_meter()
        if url:
            self._server_ready()

    def refresh_connection(self) -> None:
        """The server's settings changed (its port): the URL shown follows."""
        self._apply_connection()

    def _connection_edited(self, *_args) -> None:
        if self.url.isEnabled():  # the field held the user's own URL (not the server's, shown read-only)
            self.settings.chat_base_url = self.url.text().strip()
        self.settings.chat_use_server = self.use_server.isChecked()
        self.settings.chat_api_key = self.key.text()
        self.settings_changed.emit()
        self._apply_connection()
        if not self.settings.chat_use_server:
            self.refresh_models()

    def _apply_connection(self) -> None:
        use_server = self.settings.chat_use_server
        self.picker.served = self.server_model if self.server_url and use_server else ""
        self.eject_button.setVisible(bool(self.ejectable()))  # our server's models only
        if use_server:
            self.connection.show_server(self.server_url or f"http://127.0.0.1:{self.settings.port}/v1")
            self.session.set_endpoint(self.server_url, self.server_key, self.server_model or None,
                                      self.server_context)
            self._fill_server_models()
            if self.switching_to:
                pass  # show_switch() keeps the label up to date
            elif self.server_url:
                # The model's name is in the picker beside it; the label says where the chat goes.
                self.header.set_connection("#3fb950", "wslm server", f"{self.server_model} at {self.server_url}")
                self.view.set_empty_hint(f"Talking to {self.server_model} on the wslm server.")
            elif self.server_coming:  # as the title bar and the banner say it
                word = "loading…" if self.server_state == "loading" else "starting…"
                self.header.set_connection("#d29922", word, f"The server is {word} the chat can send once it "
                                                            "is ready")
                self.view.set_empty_hint("The server is getting ready: write your message, it is sent once "
                                         "the model is loaded.")
            else:
                self.header.set_connection("#8d96a8", "server not running")
                self.view.set_empty_hint("Start the server in the Server panel, or connect to any "
                                         "OpenAI-compatible URL under Connection.")
        else:
            if not self.model_combo.isEditable():
                self.model_combo.clear()
                self.model_combo.setEditable(True)
                self.model_combo.lineEdit().setPlaceholderText("model")
                if self.settings.chat_model:
                    self.model_combo.addItem(self.settings.chat_model)
            self.connection.show_custom(self.settings.chat_base_url)
            url = normalize_base_url(self.settings.chat_base_url)
            self.session.set_endpoint(url, self.settings.chat_api_key, self.model_combo.currentText().strip())
            self.header.set_connection("#4f9dff", url)
            self.view.set_empty_hint(f"Talking to {url}.")
        self._show_model_hint()

    def refresh_models(self) -> None:
        if self.session.base_url:
            self.lister.fetch(self.session.base_url, self.session.api_key)
        else:
            self._show_error("No URL to ask: type the server's URL (http://host:port/v1) under Connection first.")

    def _set_models(self, ids: list) -> None:
        if self.settings.chat_use_server:
            return  # our server: the picker lists installed models, not what one server serves
        current = self.model_combo.currentText()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        self.model_combo.addItems(ids)
        self.model_combo.setCurrentText(current if current in ids or not ids else ids[0])
        self.model_combo.blockSignals(False)
        self.session.model = self.model_combo.currentText().strip()

    def _model_changed(self, text: str) -> None:
        if self.settings.chat_use_server:
            return  # the request names what the server serves (set_server), not the picker's label
        self.session.model = text.strip()
        self.settings.chat_model = text.strip()
        self.settings_changed.emit()

    # The picker
    def set_installed_models(self, models: list[dict], serve_choice: str = "") -> None:
        self.picker.installed = [m for m in models if isinstance(m, dict) and m.get("id")]
        if serve_choice:
            self.serve_choice = serve_choice
        if self.settings.chat_use_server:
            self._fill_server_models()
        self._show_model_hint()

    def set_serve_choice(self, model_id: str) -> None:
        """The Server panel's model (what Start loads): the picker shows it while no server is ready, also
        after a failed switch (it showed the model from the last listing, which nothing would load)."""
        if not model_id or model_id == self.serve_choice:
            return
        self.serve_choice = model_id
        if self.settings.chat_use_server and not self.server_url and not self.switching_to:
            self._fill_server_models()
        self._show_model_hint()

    def _fill_server_models(self) -> None:
        self.picker.fill(self.switching_to or (self.server_model if self.server_url else "") or self.serve_choice)

    def set_pool_states(self, loaded: set[str], loading: str = "") -> None:
        """Which models our server has loaded, and which one it is loading (its /v1/models `state`)."""
        self.picker.set_pool_states(loaded, loading)
        self.eject_button.setVisible(bool(self.ejectable()))

    def choose_model(self, model_id: str) -> None:
        """Pick a model as the user would (tests, other panels)."""
        i = self.model_combo.findData(model_id)
        if i >= 0:
            self.model_combo.setCurrentIndex(i)
            self._model_chosen(i)

    def _model_chosen(self, index: int) -> None:
        """The picker's row `index` chosen, as a click in its list does (Browse… asks for a file)."""
        self.picker._activated(index)

    def _picked(self, model_id: str) -> None:
        """The user picked a model: with our server, switch the server to it (LM Studio's JIT load)."""
        if not self.settings.chat_use_server:
            return
        if not model_id:  # Browse… cancelled
            self._fill_server_models()
            return
        if self.model_combo.findData(model_id) < 0:
            self._fill_server_models()  # a file just browsed: listed now
        served = self.server_model if self.server_url else ""
        streaming = len(self.session.streaming_ids)
        # A model loaded beside the running one (the server's pool) leaves the replies being written alone.
        if model_id not in (served, self.switching_to) and streaming and not self.live_switch(model_id):
            # The switch stops the server under the replies being written: ask, and keep their text.
            if not self.confirm_switch(streaming):
                self._fill_server_models()  # back to the model that is writing them
                return
            self.session.interrupt("the model was switched")
        conv = self.session.current()
        if conv is not None and conv.model != model_id:
            self.session.store.update_conversation(conv.id, model=model_id)  # this chat's model from now on
        self.model_combo.setCurrentIndex(max(0, self.model_combo.findData(model_id)))
        if model_id != served and model_id != self.switching_to:
            self.model_switch_requested.emit(model_id)

    def confirm_switch(self, count: int) -> bool:
        """A model switch stops `count` streaming replies: ask first. Tests replace this."""
        return self.confirm(
            "Switch model",
            "A reply is still being written. Switching the model stops it: the text so far is kept, marked "
            "as interrupted. Switch now?" if count == 1 else
            f"{count} replies are still being written. Switching the model stops them: the text so far is "
            "kept, marked as interrupted. Switch now?")

    def _show_model_hint(self) -> None:
        conv = self.session.current()
        served = self.switching_to or (self.server_model if self.server_url else self.serve_choice)
        chat_model = next((m for m in self.installed if conv and m["id"] == conv.model), None)
        if not self.settings.chat_use_server or chat_model is None or conv.model == served:
            self.model_hint.hide()
            return
        name = html.escape(display_name(chat_model))
        # A pool load keeps the server up; a restart (or a first start) reloads it.
        how = "" if self.server_url and self.live_switch(conv.model) else \
            " (the server starts with it)" if not self.server_url else " (the server reloads)"
        self.model_hint.setText(f"This chat was with {name}. <a href='{html.escape(conv.model)}'>Switch to it</a>"
                                f"{how}, or just write: the model above answers.")
        self.model_hint.show()

    # Progress
    def show_switch(self, model_id: str, state: str, detail: str) -> None:
        """Progress of a model switch, where the user chose it."""
        name = self.picker.model_name(model_id)
        self.switching_to = "" if state in ("ready", "crashed") else model_id
        if state in ("ready", "crashed"):
            self.switch_note.hide()
        if state == "crashed":
            self._show_error(f"Could not load {name}: {detail}")
            return
        if state == "ready":
            self.error_label.hide()
            return
        self.header.set_connection("#d29922", "switching…")
        self.switch_note.setText(f"<span style='color:#d29922;'>●</span> Switching to {html.escape(name)}: "
                                 f"{SWITCH_STEPS.get(state, state)}…")
        self.switch_note.show()
        self.view.set_empty_hint(f"Loading {name}… the chat can continue once it is ready.")
        self._fill_server_models()
        self._show_model_hint()

    def show_load(self, model_id: str, state: str, error: str = "") -> None:
        """A model loaded beside the running one (the server's pool), where the user picked it: `state` as
        /v1/models says while it loads ("loading", "not-loaded": waiting its turn), then "loaded" or
        "failed" (`error`: the server's words; the chat stays with the model it had)."""
        name = self.picker.model_name(model_id)
        if state in ("loading", "not-loaded"):
            self.switching_to = model_id
            self.picker.loading_model = model_id
            self.header.set_connection("#d29922", "loading…")
            how = "the server is loading it" if state == "loading" else "waiting for the server to load it"
            self.switch_note.setText(f"<span style='color:#d29922;'>●</span> Loading {html.escape(name)}… ({how}; "
                                     "the current model keeps answering until then)")
            self.switch_note.show()
            self.view.set_empty_hint(f"Loading {name}… the chat can continue once it is ready.")
            self._fill_server_models()
            self._show_model_hint()
            return
        self.switching_to = ""
        if self.picker.loading_model == model_id:
            self.picker.loading_model = ""
        self.switch_note.hide()
        self._apply_connection()  # the picker back on the model the chat talks to (the new one once loaded)
        if state == "failed":
            kept = self.picker.model_name(self.server_model) if self.server_model else ""
            conv = self.session.current()
            if conv is not None and conv.model == model_id and self.server_model:
                self.session.store.update_conversation(conv.id, model=self.server_model)  # it never talked to it
            said = error.strip() or "no reason given"
            text = said if model_id in said or name in said else f"Could not load {name}: {said}"
            self._show_error(f"{text.rstrip('.')}.{f' The chat stays with {kept}.' if kept else ''}")
            self._show_model_hint()
        elif not self._server_note:
            self.error_label.hide()

    # Ejecting a model (the server's pool)
    def ejectable(self) -> list[str]:
        """The loaded models the server can eject now, in the picker's order (our server only)."""
        return self.picker.ejectable() if self.settings.chat_use_server else []

    def eject_actions(self) -> list:
        return self.picker.eject_actions()

    def eject_model(self, model_id: str) -> None:
        """Unload `model_id` from the server. The model this chat talks to is ejected only once confirmed;
        the chat then goes on with the model the server started with."""
        if not self.can_eject(model_id):
            return
        if self.server_url and model_id == self.server_model and not self.confirm_eject(self.picker.model_name(model_id)):
            return
        self.eject_requested.emit(model_id)

    def confirm_eject(self, name: str) -> bool:
        """Ejecting the chat's own model: ask first. Tests replace this."""
        return self.confirm("Eject model", f"This chat talks to {name}. Eject it anyway? Its memory is freed, and "
                                           "the chat goes on with the model the server started with.")

    def show_eject(self, model_id: str, error: str = "") -> None:
        """The eject's outcome: a brief word in the status bar, or the server's reason it could not."""
        name = self.picker.model_name(model_id)
        if not error:
            self.notice.emit(f"Ejected {name}: its memory is free")
            return
        said = error.strip().rstrip(".") or "no reason given"
        self._show_error(f"{said}." if model_id in said or name in said else f"Could not eject {name}: {said}.")
