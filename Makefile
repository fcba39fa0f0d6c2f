# The README's two set-up commands: `make test` and `make serve`.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2

.PHONY: deps configure build test serve format clean fuzz-build fuzz-smoke fuzz

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

# libFuzzer targets (clang, ASan + UBSan) in build-fuzz; fuzz-smoke runs each briefly on the corpus in
# fuzz/corpus (CI), fuzz runs each for FUZZ_SECONDS.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 600

$(FUZZ_BUILD)/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDS_FUZZ=ON -DDS_ENABLE_CUDA=OFF -DBUILD_TESTING=OFF

fuzz-build: deps $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

fuzz-smoke: fuzz-build
	tools/fuzz_run.sh $(FUZZ_BUILD) 10

fuzz: fuzz-build
	tools/fuzz_run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
