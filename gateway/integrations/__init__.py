"""The engine inside other programs (design D19.6).

`embedded.Embedded` is the gateway's core built without HTTP, for a program that hands it
conversations in its own event loop and forwards them itself: `compact` and, after the
program's upstream refused the result for its context, `recompact`; both call the one engine
entry point (`Engine.prepare`). `litellm.hook` is LiteLLM's callback on top of it; it is the
only module here that imports litellm, and nothing in the gateway imports it.
"""
