#!/usr/bin/env bash
# Renders helm/icecache without helm and validates the result (docs/kubernetes.md, "What CI checks").
#   scripts/render-chart.sh [OUT_DIR]     (default: build/helm-render; exit 77 = could not install)
# For each values set - the defaults, helm/icecache/ci/*.yaml - it writes OUT_DIR/<set>/rendered.yaml
# and OUT_DIR/<set>/cluster.yaml (the ConfigMap's config, read by cluster_helm_render_test), and
# fails on the first set that does not validate. Installs what it needs from Debian (only what is
# missing): golang-go, sprig, yaml.v3, yamllint, python3-yaml, python3-jsonschema. The Kubernetes
# API schema comes from the `kubernetes` Python client's generated models (a wheel from PyPI,
# fetched once into OUT_DIR/../.cache or ICECACHE_K8S_WHEEL_DIR); without PyPI that one check is
# skipped, saying so, and the others still run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-build/helm-render}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/default" "$OUT/gpu" "$OUT/init"   # no stale output for cluster_helm_render_test
CHART=helm/icecache
K8S_CLIENT_VERSION=31.0.0   # generated from the Kubernetes release-1.31 OpenAPI spec

PACKAGES=(golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev yamllint
  python3-yaml python3-jsonschema python3-six python3-urllib3)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "render-chart: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >/dev/null; }; then
    # 77: CTest's skip code (tests/cluster/CMakeLists.txt); the chart is then not checked.
    echo "render-chart: SKIPPED: could not install ${missing[*]} (no apt?); the chart was not rendered"
    exit 77
  fi
fi

# The renderer, in GOPATH mode against Debian's Go sources. sprig imports its dependencies as
# .../v3, which Debian ships without the /v3 folder: link it.
GOPATH_DIR="$OUT/gopath"
for m in sprig semver; do
  mkdir -p "$GOPATH_DIR/src/github.com/Masterminds/$m"
  ln -sfn "/usr/share/gocode/src/github.com/Masterminds/$m" "$GOPATH_DIR/src/github.com/Masterminds/$m/v3"
done
RENDER="$OUT/helm_render"
if [ ! -x "$RENDER" ] || [ tools/helm_render/main.go -nt "$RENDER" ]; then
  GO111MODULE=off GOPATH="$GOPATH_DIR:/usr/share/gocode" GOCACHE="$OUT/gocache" GOFLAGS= \
    go build -o "$RENDER" ./tools/helm_render
fi

# Kubernetes API models: the kubernetes client wheel, unpacked (pure Python; only its models and
# Configuration are imported).
CACHE=${ICECACHE_K8S_WHEEL_DIR:-$OUT/../.cache/k8s-client}
MODELS="$CACHE/kubernetes-$K8S_CLIENT_VERSION"
if [ ! -f "$MODELS/kubernetes/client/models/v1_pod_spec.py" ]; then
  mkdir -p "$CACHE"
  PIP=()
  if /usr/bin/python3 -m pip --version >/dev/null 2>&1; then PIP=(/usr/bin/python3 -m pip)
  elif command -v pip3 >/dev/null 2>&1; then PIP=(pip3)
  elif command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then PIP=(python3 -m pip)
  fi
  if [ ${#PIP[@]} -gt 0 ] && timeout 120 "${PIP[@]}" download -q --no-deps -d "$CACHE" \
      "kubernetes==$K8S_CLIENT_VERSION" >/dev/null 2>&1; then
    /usr/bin/python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
      "$CACHE/kubernetes-$K8S_CLIENT_VERSION-py2.py3-none-any.whl" "$MODELS"
  else
    echo "render-chart: WARNING: could not fetch kubernetes==$K8S_CLIENT_VERSION from PyPI;" \
      "the Kubernetes API schema check is SKIPPED (YAML, kinds, cross-object and values checks still run)"
  fi
fi
MODEL_ARGS=()
[ -f "$MODELS/kubernetes/client/models/v1_pod_spec.py" ] && MODEL_ARGS=(--k8s-models "$MODELS")

cat > "$OUT/yamllint.yaml" <<'EOF'
extends: default
rules:
  line-length: {max: 200}
  document-start: disable
  indentation: {indent-sequences: whatever}
  comments: {min-spaces-from-content: 1}
  truthy: {check-keys: false}
EOF
yamllint -c "$OUT/yamllint.yaml" "$CHART/values.yaml" "$CHART/Chart.yaml" "$CHART"/ci/*.yaml

render_set() {  # name, expected kinds, restricted|any, renderer args...
  local name=$1 kinds=$2 psa=()
  [ "$3" = restricted ] && psa=(--restricted)
  shift 3
  mkdir -p "$OUT/$name"
  "$RENDER" --release icecache --namespace inference --dump-values "$OUT/$name/values.json" "$@" \
    "$CHART" > "$OUT/$name/rendered.yaml"
  yamllint -c "$OUT/yamllint.yaml" "$OUT/$name/rendered.yaml"
  /usr/bin/python3 tools/helm_render/validate.py "$OUT/$name/rendered.yaml" "${MODEL_ARGS[@]}" \
    --values-json "$OUT/$name/values.json" --schema "$CHART/values.schema.json" \
    --expect-kinds "$kinds" "${psa[@]}" --config-out "$OUT/$name/cluster.yaml"
}

# The renderer's Helm functions on a throwaway chart: include, tpl, required, toYaml/fromYaml,
# toJson, .Capabilities, .Release, .Chart, -f merging (maps merge, null deletes), --set, and
# Helm's float64 numbers (a large number printed without toYaml or int comes out as 2e+06).
ST="$OUT/selftest"
rm -rf "$ST" && mkdir -p "$ST/chart/templates"
printf 'apiVersion: v2\nname: st\nversion: 1.2.3\nappVersion: "9"\n' > "$ST/chart/Chart.yaml"
printf 'a: {b: 1, c: two, gone: x}\nmsg: "{{ .Release.Name }}-tpl"\nneed: here\nbig: 2000000\n' > "$ST/chart/values.yaml"
printf 'a: {c: three, gone: null}\n' > "$ST/over.yaml"
cat > "$ST/chart/templates/_h.tpl" <<'EOF2'
{{- define "st.name" -}}{{ .Chart.Name }}-{{ .Chart.Version }}{{- end -}}
EOF2
cat > "$ST/chart/templates/t.yaml" <<'EOF2'
name: {{ include "st.name" . }}
tpl: {{ tpl .Values.msg . }}
req: {{ required "need is required" .Values.need }}
a: {{ toJson .Values.a }}
round: {{ (toYaml .Values.a | fromYaml).c }}
caps: {{ .Capabilities.KubeVersion.Minor }} {{ .Capabilities.APIVersions.Has "autoscaling/v2" }}
ns: {{ .Release.Namespace }} set: {{ .Values.extra }}
big: {{ .Values.big }} {{ int .Values.big }} {{ toYaml .Values.big }}
EOF2
"$RENDER" --release rel --namespace ns -f "$ST/over.yaml" --set extra=7 "$ST/chart" > "$ST/out.yaml"
cat > "$ST/want.yaml" <<'EOF2'
---
# Source: st/templates/t.yaml
name: st-1.2.3
tpl: rel-tpl
req: here
a: {"b":1,"c":"three"}
round: three
caps: 31 true
ns: ns set: 7
big: 2e+06 2000000 2000000
EOF2
diff -u "$ST/want.yaml" "$ST/out.yaml" || { echo "render-chart: helm_render self-test failed"; exit 1; }
if "$RENDER" --set need= "$ST/chart" > /dev/null 2>&1; then
  echo "render-chart: helm_render self-test: required did not fail"; exit 1
fi

render_set default ConfigMap,Deployment,Service,PodDisruptionBudget restricted
render_set gpu ConfigMap,Deployment,Service,PodDisruptionBudget,ServiceMonitor,HorizontalPodAutoscaler,Ingress,PersistentVolumeClaim \
  restricted -f "$CHART/ci/gpu-values.yaml"
# init: its model source is a hostPath, which "restricted" forbids.
render_set init ConfigMap,Deployment,Service,PodMonitor any -f "$CHART/ci/init-values.yaml"

# A values file the schema must refuse (a misspelt key), so the schema check is known to bite.
printf 'decode:\n  gpu: 1\n' > "$OUT/bad-values.yaml"
"$RENDER" --dump-values "$OUT/bad-values.json" -f "$OUT/bad-values.yaml" "$CHART" > /dev/null
if /usr/bin/python3 tools/helm_render/validate.py "$OUT/default/rendered.yaml" \
    --values-json "$OUT/bad-values.json" --schema "$CHART/values.schema.json" > "$OUT/bad-values.log"; then
  echo "render-chart: values.schema.json accepted decode.gpu (a misspelling of decode.gpus)"
  exit 1
fi
echo "render-chart: ok ($OUT)"
