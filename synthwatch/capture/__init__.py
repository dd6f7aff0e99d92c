"""Reading a server's answer: reasoning wherever the server puts it, tool calls, multi-turn conversations."""
