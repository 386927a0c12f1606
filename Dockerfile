# syntax=docker/dockerfile:1
#
# The image of vpp-route-agent: the agent, the block-ipam CNI plugin (installed onto nodes by the
# DaemonSet's initContainer) and the vppsim VPP API simulator, on distroless/static, running as nonroot.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" -t ghcr.io/vpp-route-agent/vpp-route-agent:TAG .
#
# Needs BuildKit (the default builder since Docker 23): RUN --mount, and $BUILDPLATFORM/$TARGETOS/
# $TARGETARCH, which let `docker buildx build --platform linux/amd64,linux/arm64` cross-compile on the
# build machine's own architecture instead of emulating the target's.

# golang:1.26 is the official image's tag for the newest Go 1.26.x: go.mod requires go 1.26.0.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first, in their own layer: it is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download && go mod verify
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
# CGO_ENABLED=0: static binaries, which distroless/static needs and which block-ipam needs to run on any
# node's host. -buildvcs=false: .git is not in the build context (.dockerignore); the revision is the
# REVISION label below instead.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo.Version=${VERSION}" \
      -o /out/ ./cmd/vpp-route-agent ./cmd/block-ipam ./cmd/vppsim

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="vpp-route-agent" \
      org.opencontainers.image.description="Routes to Calico IPAM blocks in the VPP FIB, and the block-ipam CNI IPAM plugin" \
      org.opencontainers.image.source="https://github.com/vpp-route-agent/vpp-route-agent" \
      org.opencontainers.image.url="https://github.com/vpp-route-agent/vpp-route-agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/vpp-route-agent /out/block-ipam /out/vppsim /usr/local/bin/
# distroless' nonroot user, given by number so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# /metrics, /healthz, /readyz, /debug/routes (--metrics-address: 127.0.0.1:9482 unless set otherwise).
EXPOSE 9482
ENTRYPOINT ["/usr/local/bin/vpp-route-agent"]
