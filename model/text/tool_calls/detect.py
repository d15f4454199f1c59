"""Which call syntax a chat template teaches, read from its source as llama.cpp's
chat-template detection does (the markup the template writes for past calls)."""

from __future__ import annotations

from ckptd.model.text.tool_calls.base import ToolFormat
from ckptd.model.text.tool_calls.generic import Generic
from ckptd.model.text.tool_calls.hermes import Hermes
from ckptd.model.text.tool_calls.llama3 import Llama3
from ckptd.model.text.tool_calls.qwen_xml import QwenXml

FORMATS = {f.name: f for f in (Hermes(), QwenXml(), Llama3(), Generic())}
PROBE = "ckptd_probe_tool"          # a tool name no template writes by itself


def detect(template: str | None) -> ToolFormat:
    src = template or ""
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return FORMATS["qwen_xml"]
    if "<tool_call>" in src:
        return FORMATS["hermes"]
    if "<|start_header_id|>" in src and "tools" in src:
        return FORMATS["llama3"]
    return FORMATS["generic"]


def shows_tools(render) -> bool:
    """Whether a template writes the tools it is given into the prompt: `render(tools)`
    renders one user message with those tools (as llama.cpp probes a template's caps)."""
    tool = {"type": "function", "function": {"name": PROBE, "description": "",
                                             "parameters": {"type": "object",
                                                            "properties": {}}}}
    try:
        return PROBE in render([tool])
    except ValueError:
        return False
