"""One module per group of CRI RPCs; each function is `async def rpc(svc: Services, request) -> response`."""
