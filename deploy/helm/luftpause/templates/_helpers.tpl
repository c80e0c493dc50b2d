{{/* The release's name prefix for every object: <release>-luftpause, or <release> when it holds "luftpause". */}}
{{- define "luftpause.fullname" -}}
{{- if contains "luftpause" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-luftpause" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "luftpause.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) -}}
{{- end -}}

{{/* Labels of every object; "component" tells the processes apart. Call with (dict "root" . "component" "x"). */}}
{{- define "luftpause.labels" -}}
app.kubernetes.io/name: luftpause
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "luftpause.selector" -}}
app.kubernetes.io/name: luftpause
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "luftpause.tokenSecret" -}}
{{- .Values.token.existingSecret | default (printf "%s-token" (include "luftpause.fullname" .)) -}}
{{- end -}}

{{- define "luftpause.engineKeysSecret" -}}
{{- .Values.engineKeys.existingSecret | default (printf "%s-engine-keys" (include "luftpause.fullname" .)) -}}
{{- end -}}

{{/*
What every luftpause container shares: the image, the configuration file from the ConfigMap, the
token from its Secret. Call with (dict "root" . "command" "scheduler" "engineKeys" true).
*/}}
{{- define "luftpause.container" -}}
image: {{ include "luftpause.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
args: [{{ .command | quote }}, "--config", "/etc/luftpause/luftpause.toml"]
env:
  - name: LUFTPAUSE_CONFIG
    value: /etc/luftpause/luftpause.toml
  - name: LUFTPAUSE_LOG_FORMAT
    value: json
{{- if or .root.Values.token.existingSecret .root.Values.token.value }}
  - name: LUFTPAUSE_TOKEN
    valueFrom:
      secretKeyRef:
        name: {{ include "luftpause.tokenSecret" .root }}
        key: LUFTPAUSE_TOKEN
{{- end }}
{{- with .store }}
  - name: LUFTPAUSE_RUNTIME__STORE
    valueFrom:
      secretKeyRef:
        name: {{ .existingSecret | quote }}
        key: {{ .key | quote }}
  # Where the other runtimes forward MCP calls about the runs this one holds (docs/runtime-store.md).
  - name: POD_IP
    valueFrom:
      fieldRef: {fieldPath: status.podIP}
  - name: LUFTPAUSE_RUNTIME__ADVERTISE_URL
    value: "http://$(POD_IP):7000"
{{- end }}
{{- if and .engineKeys (or .root.Values.engineKeys.existingSecret .root.Values.engineKeys.values) }}
envFrom:
  - secretRef:
      name: {{ include "luftpause.engineKeysSecret" .root }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
{{- end -}}

{{/* The pod-level fields every luftpause pod shares. Call with (dict "root" . "values" .Values.x). */}}
{{- define "luftpause.podSpec" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: config
    configMap:
      name: {{ include "luftpause.fullname" .root }}-config
{{- end -}}

{{/* Roll every pod when the configuration changes. */}}
{{- define "luftpause.configChecksum" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end -}}
