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
