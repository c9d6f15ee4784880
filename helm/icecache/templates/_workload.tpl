{{/* A component's Deployment and headless Service. Call with (dict "root" $ "component" NAME).
     Probes: startupProbe holds liveness and readiness off while the process loads the model (up to
     startupProbe.failureThreshold x periodSeconds); livenessProbe is a TCP connect to the gRPC
     port, so it reflects the process alone and never restarts a router whose workers are still
     loading; readinessProbe is the gRPC health check (the router's depends on its workers). */}}
{{- define "icecache.workload" -}}
{{- $root := .root -}}
{{- $component := .component -}}
{{- $c := index $root.Values $component -}}
{{- $port := index $root.Values.ports $component -}}
{{- $metrics := index $root.Values.ports (printf "%sMetrics" $component) -}}
{{- $probes := index $root.Values.probes $component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "icecache.fullname" $root }}-{{ $component }}
  labels:
    {{- include "icecache.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
spec:
  {{- if not (and $c.autoscaling $c.autoscaling.enabled) }}
  replicas: {{ $c.replicas }}
  {{- end }}
  revisionHistoryLimit: 3
  selector:
    matchLabels:
      {{- include "icecache.selector" (dict "root" $root "component" $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "icecache.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $component }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $c.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "icecache.podCommon" $root | nindent 6 }}
      {{- with include "icecache.scheduling" (dict "root" $root "component" $component) | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- /* The process drains for config.<component>.drain_seconds after SIGTERM (default 30). */}}
      {{- $drain := (index $root.Values.config $component).drain_seconds | default 30 }}
      terminationGracePeriodSeconds: {{ $c.terminationGracePeriodSeconds | default (add (ceil $drain | int) 10) }}
      {{- with include "icecache.modelInitContainer" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      containers:
        - name: {{ $component }}
          {{- include "icecache.containerCommon" $root | nindent 10 }}
          {{- if eq $component "router" }}
          command: ["icecache-{{ $component }}", "--config", "/etc/icecache/cluster.yaml"]
          {{- else }}
          {{- /* parallel.tensor_parallel_size per worker component (the ConfigMap is shared) */}}
          command: ["icecache-{{ $component }}", "--config", "/etc/icecache/cluster.yaml",
                    "--set", "parallel.tensor_parallel_size={{ int ($c.tensorParallel | default 1) }}"]
          {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $port }}
            - name: metrics
              containerPort: {{ $metrics }}
            {{- if and (eq $component "router") (gt (int $root.Values.ports.http) 0) }}
            - name: http
              containerPort: {{ $root.Values.ports.http }}
            {{- end }}
          startupProbe:
            tcpSocket:
              port: grpc
            periodSeconds: {{ $probes.startup.periodSeconds }}
            failureThreshold: {{ $probes.startup.failureThreshold }}
          livenessProbe:
            tcpSocket:
              port: grpc
            periodSeconds: {{ $probes.liveness.periodSeconds }}
            timeoutSeconds: {{ $probes.liveness.timeoutSeconds }}
            failureThreshold: {{ $probes.liveness.failureThreshold }}
          readinessProbe:
            grpc:
              port: {{ $port }}
            periodSeconds: {{ $probes.readiness.periodSeconds }}
            failureThreshold: {{ $probes.readiness.failureThreshold }}
          resources:
            {{- if eq $component "router" }}
            {{- toYaml ($c.resources | default dict) | nindent 12 }}
            {{- else }}
            {{- include "icecache.workerResources" (dict "root" $root "component" $component) | nindent 12 }}
            {{- end }}
          volumeMounts:
            {{- include "icecache.volumeMounts" $root | nindent 12 }}
      volumes:
        {{- include "icecache.modelVolume" $root | nindent 8 }}
---
# Headless: its DNS name resolves to every ready pod (the router's worker discovery, the
# ServiceMonitor and monitoring/prometheus.yml use it).
apiVersion: v1
kind: Service
metadata:
  name: {{ include "icecache.fullname" $root }}-{{ $component }}-headless
  labels:
    {{- include "icecache.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
    icecache.io/scrape: "true"
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "icecache.selector" (dict "root" $root "component" $component) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $port }}
      targetPort: grpc
    - name: metrics
      port: {{ $metrics }}
      targetPort: metrics
{{- if and $c.pdb $c.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "icecache.fullname" $root }}-{{ $component }}
  labels:
    {{- include "icecache.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
spec:
  {{- if hasKey $c.pdb "minAvailable" }}
  minAvailable: {{ $c.pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $c.pdb.maxUnavailable | default 1 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "icecache.selector" (dict "root" $root "component" $component) | nindent 6 }}
{{- end }}
{{- end -}}
