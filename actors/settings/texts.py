"""Human text in the server's language (``en`` by default, ``zh`` supported; docs/owners.md,
"Settings", **Language**): the one catalogue of every sentence, label and name the server writes
for the owner.

Theory of operation
-------------------
:data:`CATALOGUE` maps a key to its text in every language of :data:`LANGUAGES`, with
``{placeholders}`` for the values. A :class:`Text` is a *text object* (on the server, a field of a
frame written for people is a string or a text object): a key and its values. It is a ``str`` whose
value is its English rendering, so it goes wherever a string goes (a Struct field, an error message,
a log line: logs stay English), and the frame encoder of the gateway renders it into the server's
current language when the frame is sent (``actors.gateway.service``: ``enc_hook`` of
:func:`enc_hook`). A language change (``language`` in config.toml, re-read on SIGHUP; ``serve
--language`` at start) therefore applies to every frame encoded after it, also of items built
before it.

What is stored and what is rendered
-----------------------------------
Events are facts; human text belongs to what is sent. The rule, per kind of text:

* **Text for the owner's UI** (notice texts, undelivered reasons, the denial reason of a tool
  card, usage labels, place names, settings titles and labels, background-task reasons, error
  messages) is rendered at send time from a key and values. Where such a text comes from an event,
  the event keeps the key and values (``text_key`` / ``text_values`` and the like, defaults empty)
  beside the English text it always had; an event written before the key existed, or naming a
  key this build does not know, shows its stored text (:meth:`Text.stored`). Values are raw data
  and never translated (ids, names, counts, a tool's own error, the owner's note).
* **Text for the model** (tool results such as ``denied: nobody was present to approve it``, the
  ``not executed`` and crash results, the background-task notice the agent reads as its input) is
  part of the model's conversation: written once, in English, into the event, and never
  re-rendered, so a replay or a ``rerun`` rebuilds the same conversation whatever the server's
  language is now. Tool-call args, output and result are raw data, never rendered.
* **Raw data is never rendered**: tool args/output/result, facts anywhere, user text, setting
  values, effective values and defaults, titles and names people gave.

Not in the catalogue (English whatever the language, and said so): the frame-level protocol errors
built in ``protocol/`` (``parseError``, ``invalidRequest``, the handshake's version refusal) and
msgspec's own validation messages (``params.sessionId: Expected `str`, got `int```) — they name a
field of the wire, for the client's developer; a turn's failure reason (the sentence the agent
gave, a summary's ``reason``); internal errors (a bug's exception text); log lines and
``sessionloop`` command output; the Session Loop API (``loop/*``), whose readers are bots.

Missing texts: :func:`text` and :class:`Text` raise :class:`MissingText` for an unknown key, a
language a key lacks or a placeholder without a value when ``SESSIONLOOP_STRICT_TEXTS`` is set
(the test suite sets it, also for the servers it starts); at run time they fall back to English,
then to the key itself, and never fail a frame. ``tests/actors/settings/test_texts.py`` renders every key
in every language and fails when one is missing or the placeholders differ between languages.
"""

from __future__ import annotations

import os
import string
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Self

from sessionloop.protocol.frames import plain_str

__all__ = [
    "CATALOGUE",
    "DEFAULT_LANGUAGE",
    "LANGUAGES",
    "Language",
    "MissingText",
    "Text",
    "denial_reason",
    "enc_hook",
    "language_of",
    "message_of",
    "placeholders",
    "stored_parts",
    "text",
]

Language = Literal["en", "zh"]
LANGUAGES: Final[tuple[str, ...]] = ("en", "zh")
DEFAULT_LANGUAGE: Final = "en"
STRICT_ENV: Final = "SESSIONLOOP_STRICT_TEXTS"

_HISTORY_CHANGED_EN = "the history changed during compression: "
_HISTORY_CHANGED_ZH = "压缩期间历史有了变化："

#: key -> {language: text}. Keys are grouped by where the text shows; placeholders are camelCase.
CATALOGUE: Final[dict[str, dict[str, str]]] = {
    # --- notices (by notice topic) ------------------------------------------------------------------
    "notice.tool-limit": {
        "en": "Stopped after {limit} model calls; continue to let the agent go on.",
        "zh": "模型已调用 {limit} 次，这一轮先停在这里；选择继续即可让 agent 接着做。",
    },
    "notice.background-task": {
        "en": "Background task {label} ({task}) {status}",
        "zh": "后台任务 {label}（{task}）{status}",
    },
    "notice.background-task.exit": {
        "en": "Background task {label} ({task}) {status} with exit code {exitCode}",
        "zh": "后台任务 {label}（{task}）{status}，退出码 {exitCode}",
    },
    "notice.background-task.last-line": {
        "en": "{notice}; last line: {lastLine}",
        "zh": "{notice}；最后一行：{lastLine}",
    },
    "notice.compressed": {
        "en": "Compressed {turns} earlier turns into a summary",
        "zh": "已将之前的 {turns} 轮对话压缩为摘要",
    },
    "notice.compress-failed": {"en": "Compression failed: {error}", "zh": "压缩失败：{error}"},
    "notice.summary-marker": {"en": "Earlier conversation was summarized", "zh": "之前的对话已压缩为摘要"},
    # --- background tasks (BackgroundTask.status and reason) ----------------------------------------
    "task.status.running": {"en": "running", "zh": "运行中"},
    "task.status.completed": {"en": "completed", "zh": "已完成"},
    "task.status.failed": {"en": "failed", "zh": "失败"},
    "task.status.stopped": {"en": "stopped", "zh": "已停止"},
    "task.status.aborted": {"en": "aborted", "zh": "已中断"},
    "task.reason.stopped": {"en": "stopped", "zh": "已停止"},
    "task.reason.restarted": {
        "en": "the server stopped while the task was running",
        "zh": "任务运行期间服务停止了",
    },
    "task.reason.shutdown": {"en": "the server is shutting down", "zh": "服务正在关闭"},
    # --- why a compaction did not happen (session/compress says why) --------------------------------
    "compress.model-unavailable": {
        "en": "the summary model is not available: {error}",
        "zh": "摘要模型不可用：{error}",
    },
    "compress.model-failed": {"en": "the summary model failed: {error}", "zh": "摘要模型出错：{error}"},
    "compress.model-empty": {"en": "the summary model returned nothing", "zh": "摘要模型没有返回任何内容"},
    "compress.changed.input": {
        "en": _HISTORY_CHANGED_EN + "a new input arrived",
        "zh": _HISTORY_CHANGED_ZH + "来了新的输入",
    },
    "compress.changed.turn": {
        "en": _HISTORY_CHANGED_EN + "a turn started",
        "zh": _HISTORY_CHANGED_ZH + "开始了新的一轮",
    },
    "compress.changed.rewind": {
        "en": _HISTORY_CHANGED_EN + "the session was rewound",
        "zh": _HISTORY_CHANGED_ZH + "会话被回滚了",
    },
    "compress.changed.messages": {
        "en": _HISTORY_CHANGED_EN + "the messages were replaced",
        "zh": _HISTORY_CHANGED_ZH + "消息被整体替换了",
    },
    "compress.deleted": {"en": "the session was deleted during compression", "zh": "压缩期间会话被删除了"},
    "compress.parked": {"en": "the session was parked during compression", "zh": "压缩期间会话被挂起了"},
    "compress.cancelled": {"en": "cancelled: {reason}", "zh": "已取消：{reason}"},
    # --- agent messages a room never got (agent-message undelivered.reason) -------------------------
    "undelivered.before-tool": {
        "en": "said before a tool call; only the last reply of a turn is sent to the room",
        "zh": "这是工具调用之前说的话；一轮只把最后的回复发进房间",
    },
    "undelivered.retry-discarded": {
        "en": "discarded: the model call was tried again after {cause}",
        "zh": "已丢弃：{cause}后重新调用了模型",
    },
    "retry.cause.timeout": {"en": "a timeout", "zh": "超时"},
    "retry.cause.connection": {"en": "a lost connection", "zh": "连接中断"},
    "retry.cause.stream": {"en": "an error in the stream", "zh": "流式输出出错"},
    "retry.cause.error": {"en": "an error", "zh": "出错"},
    "undelivered.no-reply": {"en": "the turn ended without a reply", "zh": "这一轮没有回复就结束了"},
    # --- usage parts (the display names of usage.parts) ---------------------------------------------
    "usage.context": {"en": "Context", "zh": "上下文"},
    "usage.reply": {"en": "Reply", "zh": "回复"},
    # --- why a tool call was not approved (the tool card's reason; the model's result says the same
    # in English, text for the model) ---------------------------------------------------------------
    "denial.ineligible": {"en": "the permission mode is deny", "zh": "权限模式为拒绝（deny）"},
    "denial.absent": {"en": "nobody was present to approve it", "zh": "当时没有人在场审批"},
    "denial.rate-limit": {
        "en": "too many approvals were asked for in a short time",
        "zh": "短时间内请求的审批太多",
    },
    "denial.timeout": {"en": "nobody answered in time", "zh": "没有人及时应答"},
    "denial.turn-ended": {"en": "the turn ended", "zh": "这一轮已经结束"},
    "denial.shutdown": {
        "en": "the server restarted before the approval was answered",
        "zh": "审批得到应答之前服务重启了",
    },
    "denial.grant": {"en": "the user denies such calls (grant {grant})", "zh": "用户拒绝这类调用（授权 {grant}）"},
    "denial.answer": {"en": "the user denied it", "zh": "用户拒绝了"},
    "denial.answer-note": {"en": "the user denied it: {note}", "zh": "用户拒绝了：{note}"},
    "denial.other": {"en": "not approved ({state})", "zh": "没有获得批准（{state}）"},
    # --- places (a summary's place name, a place layer's label) -------------------------------------
    "place.default-workspace": {"en": "Default workspace", "zh": "默认工作区"},
    "place.workspace": {"en": 'Workspace "{name}"', "zh": "工作区「{name}」"},
    # --- settings layers (the labels of session/config/layers' order) -------------------------------
    "layer.global": {"en": "Global (plugin configuration)", "zh": "全局（插件配置）"},
    "layer.platform": {"en": "Platform", "zh": "平台档"},
    "layer.platformType": {"en": "Platform chat type", "zh": "平台类型档"},
    "layer.place": {"en": "Place", "zh": "场所"},
    "layer.session": {"en": "This session", "zh": "本会话"},
    # --- settings rows ------------------------------------------------------------------------------
    "settings.follow": {"en": "Follow the service preference (now: {model})", "zh": "跟随服务偏好（此刻：{model}）"},
    "settings.builtin-prompt": {"en": "Built-in prompt (the tools, the workspace and the sandbox)",
                                "zh": "内置提示词（工具、工作区与沙箱）"},
    "settings.unsaved-refused": {
        "en": "Applied, but not saved: the configuration file {path} may not be written; "
              "the change is lost on restart.",
        "zh": "已生效，但没有保存：配置文件 {path} 不许写入，重启后这项改动会丢失。",
    },
    "settings.unsaved-failed": {
        "en": "Applied, but not saved: writing the configuration file {path} failed ({error}); "
              "the change is lost on restart.",
        "zh": "已生效，但没有保存：写入配置文件 {path} 失败（{error}），重启后这项改动会丢失。",
    },
    "field.llm.model.title": {"en": "Model", "zh": "模型"},
    "field.llm.model.description": {
        "en": "The model this session talks to: one of the models the server is configured with.",
        "zh": "这个会话使用的模型：服务器配置的模型之一。",
    },
    "field.tools.permissionMode.title": {"en": "Tool permission", "zh": "工具权限"},
    "field.tools.permissionMode.description": {
        "en": "ask: approve risky calls; acceptCalls: run them; deny: refuse them.",
        "zh": "ask：有风险的调用先审批；acceptCalls：直接执行；deny：一律拒绝。",
    },
    "field.agent.maxSteps.title": {"en": "Model calls per turn", "zh": "每轮模型调用次数"},
    "field.agent.maxSteps.description": {
        "en": "After this many model calls a turn stops with a notice; continue resumes it. "
              "0: unlimited (turn/abort still stops a turn).",
        "zh": "模型调用达到这个次数后，这一轮停下并发出通知，选择继续即可接着做。"
              "0 表示不限（turn/abort 照样能停下一轮）。",
    },
    "field.agent.systemPrompt.title": {"en": "System prompt", "zh": "系统提示词"},
    "field.agent.systemPrompt.description": {
        "en": "Unset: a built-in prompt naming the tools, the workspace and the sandbox; empty: none.",
        "zh": "未设置：内置提示词，写明工具、工作区与沙箱；空：不发送提示词。"},
    "field.agent.contextChars.title": {"en": "Context budget (characters)", "zh": "上下文预算（字符数）"},
    "field.agent.contextChars.description": {
        "en": "Older context is trimmed or summarised above this size.",
        "zh": "超过这个大小时，较早的上下文会被裁剪或压缩成摘要。",
    },
    "field.tools.sandbox.title": {"en": "Command sandbox", "zh": "命令沙箱"},
    "field.tools.sandbox.description": {
        "en": "Where exec's commands run: read-only, workspace-write (the workspace is the only writable "
              "path), workspace-write+network, or danger-full-access (no sandbox).",
        "zh": "exec 的命令在哪里运行：read-only（只读）、workspace-write（只有工作区可写）、"
              "workspace-write+network（另可联网）或 danger-full-access（不用沙箱）。",
    },
    "field.tools.execYieldSeconds.title": {"en": "exec foreground seconds", "zh": "exec 前台秒数"},
    "field.tools.execYieldSeconds.description": {
        "en": "exec runs in the foreground this long, then as a background task.",
        "zh": "exec 先在前台运行这么久，之后转为后台任务。",
    },
    # --- why a setting value or write is refused (invalidParams; ``name`` is plugin/key) -------------
    "setting.expected-string": {"en": "{name}: expected a string", "zh": "{name}：应为字符串"},
    "setting.expected-model": {"en": "{name}: expected a model id", "zh": "{name}：应为模型 id"},
    "setting.max-length": {"en": "{name}: at most {max} characters", "zh": "{name}：最多 {max} 个字符"},
    "setting.expected-boolean": {"en": "{name}: expected true or false", "zh": "{name}：应为 true 或 false"},
    "setting.expected-enum": {"en": "{name}: expected one of {options}", "zh": "{name}：应为 {options} 之一"},
    "setting.expected-integer": {"en": "{name}: expected an integer", "zh": "{name}：应为整数"},
    "setting.expected-number": {"en": "{name}: expected a number", "zh": "{name}：应为数字"},
    "setting.at-least": {"en": "{name}: at least {min}", "zh": "{name}：不能小于 {min}"},
    "setting.at-most": {"en": "{name}: at most {max}", "zh": "{name}：不能大于 {max}"},
    "setting.integer-range": {
        "en": "{name}: expected an integer from -2**63 to 2**63-1",
        "zh": "{name}：应为 -2**63 到 2**63-1 之间的整数",
    },
    "setting.number-range": {
        "en": "{name}: expected a number from -2**63 to 2**63-1",
        "zh": "{name}：应为 -2**63 到 2**63-1 之间的数字",
    },
    "setting.unknown-type": {"en": "{name}: unknown field type {type}", "zh": "{name}：未知的字段类型 {type}"},
    "setting.field-problem": {"en": "{field}: {problem}", "zh": "{field}：{problem}"},
    "setting.no-such": {"en": "{field}: no session setting {name}", "zh": "{field}：没有会话设置 {name}"},
    "setting.place-narrowest": {
        "en": "{field}: {name} can be set on a place at the narrowest, not on one session",
        "zh": "{field}：{name} 最细只能设到场所，不能设在单个会话上",
    },
    "setting.not-for-kind": {
        "en": "{field}: {name} does not apply to {kind} sessions",
        "zh": "{field}：{name} 不适用于 {kind} 会话",
    },
    "setting.not-for-layer": {
        "en": "{field}: {name} does not apply to this layer",
        "zh": "{field}：{name} 不适用于这一层",
    },
    "setting.bad-platform": {"en": "{field}: not a platform name", "zh": "{field}：不是有效的平台名"},
    "setting.bad-type": {"en": "{field}: not a type name", "zh": "{field}：不是有效的类型名"},
    "setting.no-place": {
        "en": "{field}: no place is recorded with key {key}",
        "zh": "{field}：没有记录键为 {key} 的场所",
    },
    "setting.no-plugin": {
        "en": "{field}: {plugin} declares no session settings",
        "zh": "{field}：{plugin} 没有声明会话设置",
    },
    # --- errors an owner's client gets (ids, names and fields stay raw) ------------------------------
    "error.session-not-found": {"en": "session {session} not found", "zh": "会话 {session} 不存在"},
    "error.session-parked": {"en": "session {session} is parked: {reason}", "zh": "会话 {session} 已挂起：{reason}"},
    "error.session-exists": {"en": "session {session} already exists", "zh": "会话 {session} 已经存在"},
    "error.session-deleting": {"en": "session {session} is being deleted", "zh": "会话 {session} 正在删除"},
    "error.turn-not-running": {"en": "turn {turn} is not running", "zh": "回合 {turn} 没有在进行"},
    "error.turn-not-current": {
        "en": "turn {turn} is not the running turn ({current})",
        "zh": "回合 {turn} 不是正在进行的那一轮（{current}）",
    },
    "error.turn-not-found": {
        "en": "turn {turn} not found in session {session}",
        "zh": "会话 {session} 里没有回合 {turn}",
    },
    "error.title-empty": {"en": "title must not be empty", "zh": "标题不能为空"},
    "error.title-too-long": {
        "en": "{field}: at most {max} characters, got {got}",
        "zh": "{field}：最多 {max} 个字符，实际有 {got} 个",
    },
    "error.compress-running-turn": {
        "en": "session {session} is running a turn; compact refuses while running",
        "zh": "会话 {session} 有一轮正在进行，进行中不能压缩",
    },
    "error.compress-already": {
        "en": "session {session} is already being compressed; a second compaction is refused",
        "zh": "会话 {session} 正在压缩，不能同时再压缩一次",
    },
    "error.compress-refused": {"en": "compression refused: {error}", "zh": "压缩被拒绝：{error}"},
    "error.compress-failed": {"en": "compression failed: {error}", "zh": "压缩失败：{error}"},
    "error.rewind-scope": {
        "en": "scope must be 'code' or 'code-and-chat'",
        "zh": "scope 只能是 'code' 或 'code-and-chat'",
    },
    "error.rewind-busy": {
        "en": "a turn is running; rewind needs an idle session",
        "zh": "有一轮正在进行；回滚需要会话空闲",
    },
    "error.rewind-busy-meanwhile": {
        "en": "a turn started meanwhile; rewind needs an idle session",
        "zh": "期间开始了新的一轮；回滚需要会话空闲",
    },
    "error.rewind-turn": {
        "en": "turn {turn} is not an ended turn of session {session}",
        "zh": "回合 {turn} 不是会话 {session} 里已经结束的一轮",
    },
    "error.history-cursor": {
        "en": "history cursor {cursor} is no longer in the archive",
        "zh": "历史游标 {cursor} 指向的消息已不在存档里",
    },
    "error.task-not-found": {"en": "background task {task} not found", "zh": "后台任务 {task} 不存在"},
    "error.grant-not-found": {
        "en": "grant {grant} not found in session {session}",
        "zh": "会话 {session} 里没有授权 {grant}",
    },
    "error.grants-forbidden": {
        "en": "this connection's identity may not revoke approval grants",
        "zh": "这条连接的身份不能撤销审批授权",
    },
    "error.approval-settled": {"en": "approval {approval} is already settled", "zh": "审批 {approval} 已经结算"},
    "error.approval-not-found": {"en": "approval {approval} not found", "zh": "审批 {approval} 不存在"},
    "error.approval-not-recorded": {"en": "the approval could not be recorded", "zh": "审批结果没能记录下来"},
    "error.approval-forbidden": {
        "en": "this connection's identity may not answer this approval",
        "zh": "这条连接的身份不能应答这个审批",
    },
    "error.approval-hash": {
        "en": "the content hash does not match approval {approval}",
        "zh": "内容哈希与审批 {approval} 不符",
    },
    "error.params": {"en": "params.{problem}", "zh": "params.{problem}"},
    "error.grant-scope": {
        "en": "grant.scope must be 'turn' or 'session'",
        "zh": "grant.scope 只能是 'turn' 或 'session'",
    },
    "error.grant-prefix-tool": {
        "en": "grant.commandPrefix applies to exec approvals, not {tool}",
        "zh": "grant.commandPrefix 只用于 exec 的审批，不能用于 {tool}",
    },
    "error.grant-prefix-length": {
        "en": "grant.commandPrefix must be 1 to {max} characters",
        "zh": "grant.commandPrefix 须为 1 到 {max} 个字符",
    },
    "error.grant-prefix-words": {
        "en": "grant.commandPrefix must be shell words (balanced quotes)",
        "zh": "grant.commandPrefix 须为 shell 词（引号成对）",
    },
    "error.grant-expiry": {
        "en": "grant.expiresInMs must be from 1 to {max}",
        "zh": "grant.expiresInMs 须在 1 到 {max} 之间",
    },
    "error.owner-only": {"en": "{method} is for the owner", "zh": "{method} 只供 owner 使用"},
    "error.app-mode-forbidden": {
        "en": "app {app} may not set permission mode {mode}: its manifest allows {allowed}",
        "zh": "应用 {app} 不能把权限模式设为 {mode}：它的清单只允许 {allowed}",
    },
    "error.app-sandbox-forbidden": {
        "en": "app {app} may not set sandbox policy {policy}: its manifest allows at most {allowed}",
        "zh": "应用 {app} 不能把沙箱策略设为 {policy}：它的清单最多允许 {allowed}",
    },
    "error.no-answer": {"en": "no answer within {seconds} s", "zh": "{seconds} 秒内没有应答"},
    "error.host-closed": {"en": "the host is closed", "zh": "服务已关闭"},
    "error.method-unavailable": {"en": "{method} is not available on this server", "zh": "这个服务器不提供 {method}"},
    "error.too-many-attachments": {"en": "{field}: at most {max} attachments", "zh": "{field}：最多 {max} 个附件"},
    "error.not-data-url": {"en": "{field}: not a base64 data URL", "zh": "{field}：不是 base64 的 data URL"},
    "error.attachment-too-large": {
        "en": "{field}: {size} bytes, more than 20 MB",
        "zh": "{field}：{size} 字节，超过 20 MB",
    },
    "error.attachments-too-large": {"en": "{field}: more than 20 MB together", "zh": "{field}：合计超过 20 MB"},
}


class MissingText(LookupError):
    """A key, a language of a key, or a placeholder's value is missing (strict mode only)."""


def _strict() -> bool:
    return bool(os.environ.get(STRICT_ENV))


class _Values(dict[str, Any]):
    """The values of a rendering; a placeholder without one shows as itself (run time)."""

    def __missing__(self, name: str) -> str:
        if _strict():
            raise MissingText(f"no value for {{{name}}}")
        return "{" + name + "}"


def _render(key: str, language: str, values: Mapping[str, Any], fallback: str | None) -> str:
    entry = CATALOGUE.get(key)
    if entry is None:
        if _strict():
            raise MissingText(f"no text {key!r} in the catalogue")
        return fallback if fallback is not None else key
    template = entry.get(language)
    if template is None:
        if _strict() and language in LANGUAGES:
            raise MissingText(f"text {key!r} has no {language!r} version")
        template = entry[DEFAULT_LANGUAGE]
    rendered = {name: value.render(language) if isinstance(value, Text) else value for name, value in values.items()}
    try:
        return template.format_map(_Values(rendered))
    except MissingText as e:
        raise MissingText(f"text {key!r}: {e}") from None
    except (ValueError, IndexError, KeyError, TypeError):  # a value that does not fit a format spec
        if _strict():
            raise
        return fallback if fallback is not None else template


class Text(str):
    """A text object: a catalogue key and its values. As a ``str`` it is its English rendering
    (or, from :meth:`stored`, the text an event stored); :meth:`render` gives it in a language.

    Values are raw data, kept as given (a value that is itself a :class:`Text` is rendered in
    the same language). Raises :class:`MissingText` in strict mode for an unknown key or a
    placeholder without a value."""

    __slots__ = ("_fallback", "key", "values")

    key: str
    values: dict[str, Any]
    _fallback: str | None

    def __new__(cls, key: str, /, **values: Any) -> Self:
        return cls._make(key, values, None)

    @classmethod
    def _make(cls, key: str, values: Mapping[str, Any], fallback: str | None) -> Self:
        english = _render(key, DEFAULT_LANGUAGE, values, fallback)
        self = str.__new__(cls, english)
        self.key, self.values, self._fallback = key, dict(values), fallback
        return self

    @classmethod
    def stored(cls, stored: str, key: str, values: Mapping[str, Any] | None = None) -> str:
        """An event's human text: the text object of ``key`` and ``values``, or the ``stored``
        text itself when the event has no key (written before it had one) or names a key this
        build does not know (written by a newer one: never an error, in strict mode neither)."""
        if not key or key not in CATALOGUE:
            return stored
        return cls._make(key, {name: _revived(v) for name, v in (values or {}).items()}, stored)

    def render(self, language: str) -> str:
        """This text in ``language`` (English for a language the catalogue does not have)."""
        return _render(self.key, language, self.values, self._fallback)

    def __reduce__(self) -> Any:
        return (_rebuild, (self.key, self.values, self._fallback))


def _rebuild(key: str, values: dict[str, Any], fallback: str | None) -> Text:
    return Text._make(key, values, fallback)


def text(language: str, key: str, /, **values: Any) -> str:
    """The text of ``key`` in ``language``, ``values`` filled in: a plain string, for what is
    rendered once (the model's text, a log-free sentence). Strict mode raises
    :class:`MissingText`; at run time a missing language falls back to English, a missing key
    to the key itself."""
    return _render(key, language, values, None)


def language_of(value: Any) -> str:
    """``value`` as a language of the catalogue, else :data:`DEFAULT_LANGUAGE`."""
    return value if isinstance(value, str) and value in LANGUAGES else DEFAULT_LANGUAGE


def stored_parts(value: str) -> tuple[str, str, dict[str, Any]]:
    """What an event keeps of a human text: ``(English text, key, values)``; a plain string has
    no key. Values stay plain data (an event is encoded as msgpack): a value that is itself a
    text object is kept as ``{"text": key, "values": {...}, "en": English}``, which
    :meth:`Text.stored` turns back into one."""
    if not isinstance(value, Text):
        return str(value), "", {}
    return str.__str__(value), value.key, {name: _kept(v) for name, v in value.values.items()}


def _kept(value: Any) -> Any:
    if not isinstance(value, Text):
        return value
    return {"text": value.key, "values": {name: _kept(v) for name, v in value.values.items()},
            "en": str.__str__(value)}


def _revived(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"text", "values", "en"} and isinstance(value["values"], dict):
        return Text.stored(str(value["en"]), str(value["text"]), value["values"])
    return value


def message_of(error: BaseException) -> str:
    """An error's message as it was built: the text object it was raised with, if any (``str(e)``
    would give its English copy)."""
    args = getattr(error, "args", ())
    if args and isinstance(args[0], str) and args[0]:
        return args[0]
    return str(error)


def enc_hook(language: Callable[[], str]) -> Callable[[Any], Any]:
    """An msgspec ``enc_hook`` that renders every text object in ``language()`` (read when each
    frame is encoded: a change applies to the next frame) and any other ``str`` subclass as a
    plain string."""

    def hook(obj: Any) -> Any:
        if isinstance(obj, Text):
            return obj.render(language())
        return plain_str(obj)

    return hook


def denial_reason(settlement: Any) -> Text:
    """Why a tool call was not approved, from its settlement (``state``, ``source``, ``grant_id``,
    ``note``): the tool card's ``reason``; its English is what the model is told."""
    source = settlement.source
    if source == "grant":
        return Text("denial.grant", grant=settlement.grant_id or "")
    if source == "answer":
        return Text("denial.answer-note", note=settlement.note) if settlement.note else Text("denial.answer")
    if f"denial.{source}" in CATALOGUE:
        return Text(f"denial.{source}")
    return Text("denial.other", state=settlement.state)


def placeholders(template: str) -> set[str]:
    """The placeholder names of a catalogue template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
