"""Tool calls and thinking read out of a chat answer's text, in the syntax its chat
template teaches (detect.py): Hermes/Qwen2.5/Qwen3 JSON in <tool_call> tags, Qwen3-
Coder/Qwen3.5 XML, Llama 3.x JSON, and a generic JSON format for templates that show
none. constrain.py makes the grammar that forces a call (tool_choice)."""
