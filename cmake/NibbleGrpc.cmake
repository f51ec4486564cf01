# nibble_grpc_library(TARGET PROTO_ROOT DIR PROTOS a.proto ...)
# Generates C++ messages and gRPC stubs for PROTOS (paths relative to DIR) and
# builds them into the static library TARGET, whose users include them as
# "path/to/a.pb.h" and "path/to/a.grpc.pb.h".
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(NIBBLE_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

function(nibble_grpc_library target)
  cmake_parse_arguments(ARG "" "PROTO_ROOT" "PROTOS" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target})
  set(sources)
  foreach(proto ${ARG_PROTOS})
    string(REGEX REPLACE "\\.proto$" "" stem ${proto})
    set(outputs ${out}/${stem}.pb.cc ${out}/${stem}.pb.h
                ${out}/${stem}.grpc.pb.cc ${out}/${stem}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outputs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
      COMMAND protobuf::protoc ARGS --proto_path=${ARG_PROTO_ROOT}
              --cpp_out=${out} --grpc_out=${out}
              --plugin=protoc-gen-grpc=${NIBBLE_GRPC_CPP_PLUGIN}
              ${ARG_PROTO_ROOT}/${proto}
      DEPENDS ${ARG_PROTO_ROOT}/${proto}
      COMMENT "Generating C++ from ${proto}")
    list(APPEND sources ${outputs})
  endforeach()
  add_library(${target} STATIC ${sources})
  target_include_directories(${target} SYSTEM PUBLIC ${out})
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf gRPC::grpc++)
  target_compile_options(${target} PRIVATE -w)
endfunction()
