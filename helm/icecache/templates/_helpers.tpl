{{- define "icecache.fullname" -}}
{{- printf "%s" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "icecache.labels" -}}
app.kubernetes.io/name: icecache
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "icecache.selector" -}}
app.kubernetes.io/name: icecache
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* DNS name "service.namespace.svc.cluster.local:port" of a component's headless Service. */}}
{{- define "icecache.headless" -}}
{{- printf "%s-%s-headless.%s.svc.cluster.local:%v" (include "icecache.fullname" .root) .component .root.Release.Namespace .port -}}
{{- end -}}

{{/* Scheduling keys of a component's pod spec: nodeSelector, tolerations, affinity,
     topologySpreadConstraints (labelSelector filled with the component's selector when absent),
     runtimeClassName, priorityClassName. Call with (dict "root" $ "component" "decode"). */}}
{{- define "icecache.scheduling" -}}
{{- $c := index .root.Values .component -}}
{{- with $c.runtimeClassName }}
runtimeClassName: {{ . | quote }}
{{- end }}
{{- with $c.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $c.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range $c.topologySpreadConstraints }}
  {{- $t := deepCopy . }}
  {{- if not $t.labelSelector }}
  {{- $_ := set $t "labelSelector" (dict "matchLabels" (include "icecache.selector" (dict "root" $.root "component" $.component) | fromYaml)) }}
  {{- end }}
  - {{ toYaml $t | indent 4 | trim }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level parts every component shares: service account token, pull secrets, security
     context, termination grace. */}}
{{- define "icecache.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The image reference: repository:tag, or repository@digest when image.digest is set. */}}
{{- define "icecache.image" -}}
{{- if .Values.image.digest -}}
{{ printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end -}}
{{- end -}}

{{/* Container-level parts every component shares: image, env, security context. */}}
{{- define "icecache.containerCommon" -}}
image: {{ include "icecache.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- with .Values.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Bytes per element of config.cache.kv_dtype. */}}
{{- define "icecache.kvDtypeBytes" -}}
{{- $d := .Values.config.cache.kv_dtype | default "bf16" -}}
{{- if eq $d "f32" }}4{{ else }}2{{ end -}}
{{- end -}}

{{/* Memory (MiB) a decode pod needs: the host page pool plus the model and an overhead,
     pool_pages x (2 x page_size x head_dim x sizeof(kv_dtype)) + modelMiB + overheadMiB. */}}
{{- define "icecache.decodeMemoryMiB" -}}
{{- $m := .Values.decode.memory -}}
{{- $pageBytes := mul 2 (int .Values.config.cache.page_size) (int $m.headDim) (int (include "icecache.kvDtypeBytes" .)) -}}
{{- $poolMiB := div (mul (int64 .Values.config.decode.pool_pages) $pageBytes) 1048576 -}}
{{- add $poolMiB (int $m.modelMiB) (int $m.overheadMiB) -}}
{{- end -}}

{{/* Resources of a worker container: the values' resources, plus nvidia.com/gpu limits of gpus x
     tensorParallel (GPUs per rank x ranks), plus (decode, memory.auto) memory requests and limits
     from the page-pool formula. */}}
{{- define "icecache.workerResources" -}}
{{- $c := index .root.Values .component -}}
{{- $res := deepCopy ($c.resources | default dict) -}}
{{- $limits := deepCopy ($res.limits | default dict) -}}
{{- $requests := deepCopy ($res.requests | default dict) -}}
{{- if gt (int $c.gpus) 0 }}
{{- $_ := set $limits "nvidia.com/gpu" (mul (int $c.gpus) (int ($c.tensorParallel | default 1))) }}
{{- end }}
{{- if and $c.memory $c.memory.auto }}
{{- $mem := printf "%sMi" (include (printf "icecache.%sMemoryMiB" .component) .root) }}
{{- if not (hasKey $limits "memory") }}{{ $_ := set $limits "memory" $mem }}{{ end }}
{{- if not (hasKey $requests "memory") }}{{ $_ := set $requests "memory" $mem }}{{ end }}
{{- end }}
{{- if $limits }}{{ $_ := set $res "limits" $limits }}{{ end }}
{{- if $requests }}{{ $_ := set $res "requests" $requests }}{{ end }}
{{- toYaml $res -}}
{{- end -}}

{{/* Memory (MiB) a prefill pod needs: the model plus an overhead (the build pool of the longest
     prompt belongs in overheadMiB; docs/kubernetes.md). */}}
{{- define "icecache.prefillMemoryMiB" -}}
{{- $m := .Values.prefill.memory -}}
{{- add (int $m.modelMiB) (int $m.overheadMiB) -}}
{{- end -}}

{{/* The model volume of every pod: the chart's PVC, an emptyDir filled by an init container, or
     modelVolume as given. */}}
{{- define "icecache.modelVolume" -}}
- name: model
{{- if .Values.modelInit.enabled }}
  emptyDir:
    {{- with .Values.modelInit.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- else if .Values.modelPvc.create }}
  persistentVolumeClaim:
    claimName: {{ include "icecache.fullname" . }}-model
    readOnly: true
{{- else }}
  {{- toYaml .Values.modelVolume | nindent 2 }}
{{- end }}
- name: config
  configMap:
    name: {{ include "icecache.fullname" . }}-config
- name: tmp
  emptyDir: {}
{{- if .Values.internalTls.secretName }}
- name: internal-tls
  secret:
    secretName: {{ .Values.internalTls.secretName }}
    defaultMode: 0440
{{- end }}
{{- with .Values.modelInit.sourceVolume }}
{{- if $.Values.modelInit.enabled }}
- name: model-source
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The init container that copies a model into the emptyDir (modelInit.enabled). */}}
{{- define "icecache.modelInitContainer" -}}
{{- if .Values.modelInit.enabled }}
initContainers:
  - name: model-copy
    image: {{ .Values.modelInit.image | default (include "icecache.image" .) | quote }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      {{- toYaml .Values.modelInit.command | nindent 6 }}
    env:
      - name: MODEL_DIR
        value: {{ .Values.modelDir | quote }}
    {{- with .Values.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with .Values.modelInit.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: model
        mountPath: {{ .Values.modelDir }}
      - name: tmp
        mountPath: /tmp
      {{- if .Values.modelInit.sourceVolume }}
      - name: model-source
        mountPath: /model-source
        readOnly: true
      {{- end }}
{{- end }}
{{- end -}}

{{/* volumeMounts of every icecache container. */}}
{{- define "icecache.volumeMounts" -}}
- name: config
  mountPath: /etc/icecache
  readOnly: true
- name: model
  mountPath: {{ .Values.modelDir }}
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.internalTls.secretName }}
- name: internal-tls
  mountPath: /etc/icecache-tls
  readOnly: true
{{- end }}
{{- end -}}
