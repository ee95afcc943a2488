"""The exact hit's floors in `semserve bench cache` (issue 26): servers with no framework that answer
with a body of the same size as the transformer's exact-hit answer.

  REST  a raw ASGI app (`async def app(scope, receive, send)`) on uvicorn, with the transformer's
        uvicorn settings (asyncio loop, no access log); it reads the request body and sends the
        stored bytes as application/json.
  gRPC  a bare grpc.aio server with one generic handler for ModelInfer: the request is parsed with
        the repo's v2 messages (semserve/v2/inference_pb2) and the stored ModelInferResponse
        serialized back, as any server must.

Run in its own process, so its event loop shares nothing with the bench's client:

    python -m bench.bare_peers --http-port P --grpc-port G --rest-body FILE --grpc-body FILE

It prints `ready` on stdout once both listen, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

# The method name the v2 gRPC clients call (KServe's `inference` package); the messages are
# wire-compatible with semserve/v2's.
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def asgi_app(body: bytes) -> Any:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:  # the whole request body, as a real handler would read it
            msg = await receive()
            more = msg.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def serve(http_port: int, grpc_port: int, rest_body: bytes, grpc_body: bytes) -> None:
    import grpc
    import uvicorn

    from semserve.v2 import inference_pb2 as pb

    response = pb.ModelInferResponse.FromString(grpc_body)

    async def model_infer(request: Any, context: Any) -> Any:
        return response

    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString,
        ),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    config = uvicorn.Config(asgi_app(rest_body), host="127.0.0.1", port=http_port, log_config=None,
                            access_log=False, loop="asyncio", lifespan="off")
    web = uvicorn.Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    web_task = asyncio.ensure_future(web.serve())
    while not web.started:
        if web_task.done():
            web_task.result()
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    await stop.wait()
    web.should_exit = True
    await web_task
    await server.stop(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--rest-body", type=Path, required=True, help="bytes of the REST answer")
    p.add_argument("--grpc-body", type=Path, required=True, help="a serialized ModelInferResponse")
    args = p.parse_args(argv)
    rest, grpc_body = args.rest_body.read_bytes(), args.grpc_body.read_bytes()
    asyncio.run(serve(args.http_port, args.grpc_port, rest, grpc_body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
