{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "shardq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the prefix of every object. */}}
{{- define "shardq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shardq.workerName" -}}
{{- printf "%s-worker" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "shardq.labels" -}}
helm.sh/chart: {{ include "shardq.chart" . }}
app.kubernetes.io/name: {{ include "shardq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "shardq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shardq.dispatcherSelectorLabels" -}}
{{ include "shardq.selectorLabels" . }}
app.kubernetes.io/component: dispatcher
{{- end }}

{{- define "shardq.workerSelectorLabels" -}}
{{ include "shardq.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{/* The dispatcher image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "shardq.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The gRPC address workers and dispatcherctl use inside the cluster. */}}
{{- define "shardq.target" -}}
{{- printf "%s:%v" (include "shardq.fullname" .) .Values.service.grpcPort }}
{{- end }}

{{/* Secret names, failing the render with a clear message when they are missing. The development
profile uses the Secret it generates (dev-secret.yaml) instead. */}}
{{- define "shardq.redisSecret" -}}
{{- if .Values.dev.enabled }}
{{- include "shardq.devSecret" . }}
{{- else }}
{{- required "redis.existingSecret is required: the name of a Secret in this namespace whose key redis.secretKey holds SHARDQ_REDIS_URL (redis://, redis+cluster://host:port,...); or try the development profile: -f values-dev.yaml" .Values.redis.existingSecret }}
{{- end }}
{{- end }}

{{- define "shardq.redisSecretKey" -}}
{{- if .Values.dev.enabled }}redis-url{{ else }}{{ .Values.redis.secretKey }}{{ end }}
{{- end }}

{{- define "shardq.databaseSecret" -}}
{{- if .Values.dev.enabled }}
{{- include "shardq.devSecret" . }}
{{- else }}
{{- required "database.existingSecret is required: the name of a Secret in this namespace whose key database.secretKey holds SHARDQ_DB_URL (postgresql://...?sslmode=require); or try the development profile: -f values-dev.yaml" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{- define "shardq.databaseSecretKey" -}}
{{- if .Values.dev.enabled }}db-url{{ else }}{{ .Values.database.secretKey }}{{ end }}
{{- end }}

{{/* The development profile's objects. */}}
{{- define "shardq.devSecret" -}}
{{- printf "%s-dev-credentials" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardq.devRedis" -}}
{{- printf "%s-redis" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardq.devPostgresql" -}}
{{- printf "%s-postgresql" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardq.demoWorker" -}}
{{- printf "%s-demo-worker" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The development profile refuses what it cannot honour, before anything is rendered. */}}
{{- define "shardq.devChecks" -}}
{{- if .Values.dev.enabled }}
{{- if or .Values.redis.existingSecret .Values.database.existingSecret }}
{{- fail "dev.enabled runs Redis and PostgreSQL in the release: leave redis.existingSecret and database.existingSecret empty (set them without the development profile to use your own)" }}
{{- end }}
{{- if or .Values.tls.enabled .Values.auth.enabled }}
{{- fail "dev.enabled is for trying shardq: it does not combine with tls.enabled or auth.enabled (use the production values)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A single-pod dependency's pod security: non-root as the image's own user. */}}
{{- define "shardq.devPodSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "shardq.devContainerSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The name checked in the dispatchers' certificate. */}}
{{- define "shardq.tlsServerName" -}}
{{- .Values.tls.serverName | default (printf "%s.%s.svc" (include "shardq.fullname" .) .Release.Namespace) }}
{{- end }}

{{- define "shardq.tlsSecret" -}}
{{- required "tls.existingSecret is required when tls.enabled: a Secret with tls.crt, tls.key and ca.crt" .Values.tls.existingSecret }}
{{- end }}

{{- define "shardq.authSecret" -}}
{{- required "auth.existingSecret is required when auth.enabled: a Secret with the tokens file (key auth.tokensKey) and the peer token (key auth.peerTokenKey)" .Values.auth.existingSecret }}
{{- end }}

{{/* The port the kubelet probes: the plaintext health port when the gRPC port is TLS. */}}
{{- define "shardq.probePort" -}}
{{- if .Values.tls.enabled }}{{ .Values.tls.healthPort }}{{ else }}7070{{ end }}
{{- end }}

{{/* PromQL matchers picking this release's dispatcher series (alert rules). */}}
{{- define "shardq.metricSelector" -}}
{{- .Values.prometheusRule.selector | default (printf "namespace=%q,job=%q" .Release.Namespace (include "shardq.fullname" .)) }}
{{- end }}

{{/* An alert's labels: its severity and prometheusRule.alertLabels. */}}
{{- define "shardq.alertLabels" -}}
severity: {{ .severity }}
{{- with .root.Values.prometheusRule.alertLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "shardq.dashboard" -}}
{{- printf "%s-dashboard" (include "shardq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
