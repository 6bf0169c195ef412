# Passed by scripts/serving/setup_llamacpp.sh as CMAKE_PROJECT_llama_cpp_INCLUDE: read right after llama-cpp-python's
# project(llama_cpp), before its CMakeLists forces the cache entry LLAMA_BUILD_COMMON to ON.
#
# llama.cpp's common library (libllama-common: argument parsing, chat templates, JSON and Jinja; 52 of the build's
# 140 compile steps, about half its time) is not loaded by llama_cpp, which binds libllama and the ggml libraries
# alone. A normal variable of the same name hides the cache entry from the vendored llama.cpp's `if
# (LLAMA_BUILD_COMMON)` (policy CMP0126, NEW under llama-cpp-python's cmake_minimum_required 3.21: setting a cache
# entry leaves a normal variable of its name in place), so the library is neither built nor installed.
set(LLAMA_BUILD_COMMON OFF)
