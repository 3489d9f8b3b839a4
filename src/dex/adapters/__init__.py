"""Framework adapters: run an agent written for another framework on Dex.

Each adapter is a ``dex.models.Model``: one RunModel Step runs one *segment* of the
framework's turn, up to the first Dex tool call(s), which Dex then runs as its own tool
Steps. Import the adapter you use; its framework is an optional extra:

- ``dex.adapters.openai_agents`` (``pip install 'dex-runtime[openai-agents]'``)
- ``dex.adapters.claude_agent_sdk`` (``pip install 'dex-runtime[claude-agent-sdk]'``)

See docs/agent-frameworks.md.
"""
