# attnserve.v1's generated stubs (attention_pb2, attention_pb2_grpc) land here at build time.
