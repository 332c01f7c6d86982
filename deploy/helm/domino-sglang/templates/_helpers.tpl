{{/* Names and labels shared by the templates. */}}
{{- define "domino.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "domino.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "domino.serverSelector" -}}
app.kubernetes.io/name: domino-sglang
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "domino.routerSelector" -}}
app.kubernetes.io/name: domino-sglang-router
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "domino.image" -}}
{{- $repo := required "image.repository is required: the image built from the repository's Dockerfile, pushed to your registry" .Values.image.repository -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "domino.cacheClaim" -}}
{{- default (printf "%s-cache" (include "domino.fullname" .)) .Values.cache.persistentVolumeClaim.existingClaim -}}
{{- end -}}

{{- define "domino.hfSecret" -}}
{{- if .Values.hfToken.create -}}
{{- printf "%s-hf-token" (include "domino.fullname" .) -}}
{{- else -}}
{{- .Values.hfToken.secretName -}}
{{- end -}}
{{- end -}}
