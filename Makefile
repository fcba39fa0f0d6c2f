# The README's two set-up commands: `make test` and `make serve`.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2

.PHONY: deps configure build test serve format clean

deps:
	@tools/install_deps.sh
	@tools/fetch_tokenizer.sh >/dev/null

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every CPU test (GPU tests carry the label `gpu` and run on the H200 test machine).
test: build
	ctest --test-dir $(BUILD) -L cpu --output-on-failure -j $(JOBS)

# The OpenAI-compatible server on 127.0.0.1:8000: the embedded default (random-weight) model with
# the real Qwen3 tokenizer, on the CPU.
serve: build
	$(BUILD)/deltaserve serve --host 127.0.0.1 --port 8000 --tokenizer $$(tools/fetch_tokenizer.sh)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
