"""The asyncio API (the source the sync API is generated from)."""
