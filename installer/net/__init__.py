"""Everything the installer fetches goes through here, in the order a request does:
``policy`` (which URLs, how they are shown, safe file names), ``integrity`` (sha256 pins),
``session`` (the HTTP session and the one reading of a response), ``retry`` and ``pace``
(how often, how long, how slow), ``transfer`` (one artifact to disk), ``parallel``
(several at once) and ``fetch`` (small documents and existence probes).

Nothing is imported here: ``policy`` and ``integrity`` must stay free of ``requests``
(a cache hit checks URLs but downloads nothing).
"""
