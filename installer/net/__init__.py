"""Everything the installer fetches goes through here, in the order a request does:
``policy`` (which URLs, how they are shown, safe file names), ``integrity`` (sha256 pins),
``session`` (the HTTP session and the one reading of a response), ``retry`` and ``pace``
(how often, how long, how slow), ``transfer`` (one artifact to disk), ``parallel``
(several at once) and ``fetch`` (small documents and existence probes).

Nothing is imported here. ``requests`` and ``tenacity`` load with the first request, not
with these modules (a cache hit, every boot, plans with them and fetches nothing; pip
defers its network stack the same way): only ``session`` imports ``requests`` at its top,
and the rest import ``session`` where a request is made (``fetch``, ``transfer``,
the Context's session) and ``tenacity`` where a retryer is made.
"""
