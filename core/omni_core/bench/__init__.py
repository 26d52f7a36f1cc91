"""``omni bench``: a load generator that measures any OpenAI-compatible speech server over HTTP.

It never imports the server: requests go through httpx, so the same numbers can be taken from
omni or from any other server speaking the same endpoints.
"""
