"""Built-in chat templates by name, as llama-server's `--chat-template NAME` knows them.

Each is the jinja form of the format its model family documents; `resolve` turns a
name or jinja source into what `render_chat` renders. A name that is not here and
is not jinja is a user error, not a silent fallback to ChatML.
"""

from __future__ import annotations

from ckptd.model.text.chat import CHATML, compile_template

_SYSTEM_FIRST = ("{% if messages[0]['role'] == 'system' %}"
                 "{% set sys = messages[0]['content'] %}{% set msgs = messages[1:] %}"
                 "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}")

BUILTIN: dict[str, str] = {
    "chatml": CHATML,
    "llama3": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>"
        "\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>"
        "\\n\\n' }}{% endif %}"),
    "llama2": _SYSTEM_FIRST + (
        "{% for m in msgs %}{% if m['role'] == 'user' %}{{ '[INST] ' }}"
        "{% if loop.first and sys %}{{ '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' }}{% endif %}"
        "{{ m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + '</s>' }}"
        "{% endif %}{% endfor %}"),
    "mistral": _SYSTEM_FIRST + (
        "{% for m in msgs %}{% if m['role'] == 'user' %}{{ '[INST] ' }}"
        "{% if loop.first and sys %}{{ sys + '\\n\\n' }}{% endif %}"
        "{{ m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + '</s>' }}"
        "{% endif %}{% endfor %}"),
    "gemma": _SYSTEM_FIRST + (
        "{% for m in msgs %}{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
        "{{ '<start_of_turn>' + role + '\\n' }}{% if loop.first and sys %}"
        "{{ sys + '\\n\\n' }}{% endif %}{{ m['content'] + '<end_of_turn>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"),
    "phi3": (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
    "zephyr": (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '</s>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
    "command-r": (
        "{% for m in messages %}{% set role = {'system': 'SYSTEM', 'user': 'USER', "
        "'assistant': 'CHATBOT'}.get(m['role'], 'USER') %}"
        "{{ '<|START_OF_TURN_TOKEN|><|' + role + '_TOKEN|>' + m['content'] + "
        "'<|END_OF_TURN_TOKEN|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"),
    "vicuna": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\\n' }}"
        "{% elif m['role'] == 'user' %}{{ 'USER: ' + m['content'] + '\\n' }}"
        "{% else %}{{ 'ASSISTANT: ' + m['content'] + '</s>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"),
    "deepseek": (
        "{% for m in messages %}{% if m['role'] == 'user' %}"
        "{{ '### Instruction:\\n' + m['content'] + '\\n' }}"
        "{% elif m['role'] == 'assistant' %}{{ '### Response:\\n' + m['content'] + "
        "'\\n<|EOT|>\\n' }}{% else %}{{ m['content'] + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '### Response:\\n' }}{% endif %}"),
}


def resolve(name_or_source: str) -> str:
    """The jinja source for a built-in name, or the source itself; ValueError for a name
    that is neither (compiled here, so a bad template fails at start-up)."""
    if name_or_source in BUILTIN:
        return BUILTIN[name_or_source]
    if "{%" not in name_or_source and "{{" not in name_or_source:
        raise ValueError(f"chat template {name_or_source!r} is not a built-in name "
                         f"({', '.join(sorted(BUILTIN))}) nor jinja source")
    compile_template(name_or_source)
    return name_or_source
