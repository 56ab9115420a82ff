"""The settings' human-facing sentences in the server's language (seed 004: layer labels, the
"follow the service preference" choice, and what an unsaved change says), English and Chinese;
an unknown language or text id falls back to English."""

from __future__ import annotations

from typing import Any

_TEXTS: dict[str, dict[str, str]] = {
    "en": {
        "global": "Global (plugin configuration)", "platform": "Platform", "platformType": "Platform chat type",
        "place": "Place", "session": "This session", "default-workspace": "Default workspace",
        "workspace": 'Workspace "{name}"', "follow": "Follow the service preference (now: {model})",
        "builtin-prompt": "Built-in prompt (the tools, the workspace and the sandbox)",
        "refused": "Applied, but not saved: the configuration file {path} may not be written; "
                   "the change is lost on restart.",
        "failed": "Applied, but not saved: writing the configuration file {path} failed ({error}); "
                  "the change is lost on restart.",
    },
    "zh": {
        "global": "全局(插件配置)", "platform": "平台档", "platformType": "平台类型档", "place": "场所",
        "session": "本会话", "default-workspace": "默认工作区", "workspace": "工作区「{name}」",
        "follow": "跟随服务偏好(此刻:{model})",
        "builtin-prompt": "内置提示词(工具、工作区与沙箱)",
        "refused": "已生效,但没有保存:配置文件 {path} 不许写入,重启后这项改动会丢失。",
        "failed": "已生效,但没有保存:写入配置文件 {path} 失败({error}),重启后这项改动会丢失。",
    },
}


def text(language: str, text_id: str, **values: Any) -> str:
    table = _TEXTS.get(language, _TEXTS["en"])
    return table.get(text_id, _TEXTS["en"][text_id]).format(**values)
