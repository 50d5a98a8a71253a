"""Developer tools, off the serving path: the demo and its echo model, the local llama.cpp model,
the plan and LiteLLM-import commands, and the gateway's parts built without HTTP."""
