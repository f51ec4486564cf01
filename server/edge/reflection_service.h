// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), beside the
// v1alpha service that gRPC's reflection plugin adds: the same services, from
// the same descriptor pool (the generated one), for tools that speak only v1.
// gRPC 1.51 ships no v1 service, so this is nibble's own, on the protocol in
// proto/grpc/reflection/v1/reflection.proto.
//
// A server builder plugin registers it and gives it the server's list of
// services, as gRPC gives its own.
//
// Example:
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&my_service);
//   nibble::server::AddReflectionV1(builder);
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   // grpcurl's v1 client now lists and describes my_service.
#ifndef NIBBLE_SERVER_EDGE_REFLECTION_SERVICE_H_
#define NIBBLE_SERVER_EDGE_REFLECTION_SERVICE_H_

#include "grpcpp/server_builder.h"

namespace nibble::server {

// Makes the server that `builder` builds serve grpc.reflection.v1, listing
// every service registered on it.
void AddReflectionV1(grpc::ServerBuilder& builder);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_REFLECTION_SERVICE_H_
