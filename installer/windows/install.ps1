<#
.SYNOPSIS
    wslm for Windows: checks Windows and WSL, installs wslm inside a WSL distro (install.sh), installs the
    desktop app and a Start-menu shortcut. Safe to re-run.

.DESCRIPTION
    powershell -ExecutionPolicy Bypass -File install.ps1                 install (asks which distro)
    powershell -ExecutionPolicy Bypass -File install.ps1 -Distro Ubuntu  install into Ubuntu
    powershell -ExecutionPolicy Bypass -File install.ps1 -Uninstall      remove wslm's LAN sharing rules
                                                                          (portproxy, firewall), the app,
                                                                          the shortcut and wslm in the distro

    Every progress line starts with "[wslm-install]"; failures print "[wslm-install] error: ..." and
    "[wslm-install] fix: ..." and exit with code 1.
#>
[CmdletBinding()]
param(
    [string]$Distro = "",
    [string]$Source = "",
    [string]$InstallDir = "",
    [switch]$Uninstall,
    [switch]$SkipGui,
    [switch]$Yes
)

Set-StrictMode -Version 2.0
$ErrorActionPreference = "Stop"
$Tag = "[wslm-install]"
$MinBuild = 19041
$TotalSteps = 6
# Linux programs print UTF-8; wsl.exe passes their bytes through.
try {
    [Console]::OutputEncoding = New-Object System.Text.UTF8Encoding $false
} catch {
    Write-Verbose "no console to set the output encoding of"
}

if ($InstallDir -eq "") { $InstallDir = Join-Path $env:LOCALAPPDATA "Programs\wslm" }
$RecordPath = Join-Path $InstallDir "installed.json"
$GuiVenv = Join-Path $InstallDir "gui-venv"
$GuiBundle = Join-Path $InstallDir "gui"
$ShortcutPath = Join-Path ([Environment]::GetFolderPath("Programs")) "wslm.lnk"
$InstallSh = Join-Path $PSScriptRoot "..\wsl\install.sh"
if (-not (Test-Path -LiteralPath $InstallSh)) { $InstallSh = Join-Path $PSScriptRoot "install.sh" }
$Checkout = Join-Path $PSScriptRoot "..\.."

function Write-Info([string]$Text) {
    Write-Host "$Tag $Text"
}

function Write-Step([int]$Number, [string]$Text) {
    Write-Host "$Tag step $Number/${TotalSteps}: $Text" -ForegroundColor Cyan
    Write-Progress -Activity "Installing wslm" -Status $Text -PercentComplete ([int](100 * ($Number - 1) / $TotalSteps))
}

function Stop-WithError([string]$What, [string]$Fix) {
    Write-Host "$Tag error: $What" -ForegroundColor Red
    if ($Fix -ne "") { Write-Host "$Tag fix: $Fix" -ForegroundColor Yellow }
    exit 1
}

function Confirm-Choice([string]$Question) {
    if ($Yes) { return $true }
    $answer = Read-Host "$Question [Y/n]"
    return ($answer -eq "" -or $answer -match "^[Yy]")
}

function Test-Admin {
    $identity = [Security.Principal.WindowsIdentity]::GetCurrent()
    $principal = New-Object Security.Principal.WindowsPrincipal $identity
    return $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)
}

function Get-WslExe {
    # A 32-bit PowerShell sees SysWOW64 as System32, where wsl.exe does not exist; Sysnative is the real one.
    foreach ($folder in @("System32", "Sysnative")) {
        $candidate = Join-Path $env:SystemRoot "$folder\wsl.exe"
        if (Test-Path -LiteralPath $candidate) { return $candidate }
    }
    return $null
}

function Test-DistroName([string]$Name) {
    # The same rule as wslm.wsl_bridge.validate: nothing a command line could misread.
    return ($Name -match "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
}

function Invoke-Captured([string]$Exe, [string]$Arguments, [System.Text.Encoding]$Encoding, [byte[]]$InputBytes) {
    # A program's output in the given encoding (wsl -l prints UTF-16LE), optionally with bytes on its stdin.
    $psi = New-Object System.Diagnostics.ProcessStartInfo
    $psi.FileName = $Exe
    $psi.Arguments = $Arguments
    $psi.UseShellExecute = $false
    $psi.CreateNoWindow = $true
    $psi.RedirectStandardOutput = $true
    $psi.RedirectStandardError = $true
    $psi.RedirectStandardInput = ($null -ne $InputBytes)
    $psi.StandardOutputEncoding = $Encoding
    $psi.StandardErrorEncoding = $Encoding
    if ($psi.EnvironmentVariables.ContainsKey("WSL_UTF8")) { $psi.EnvironmentVariables.Remove("WSL_UTF8") }
    $proc = [System.Diagnostics.Process]::Start($psi)
    if ($null -ne $InputBytes) {
        $proc.StandardInput.BaseStream.Write($InputBytes, 0, $InputBytes.Length)
        $proc.StandardInput.Close()
    }
    $stderrTask = $proc.StandardError.ReadToEndAsync()
    $stdout = $proc.StandardOutput.ReadToEnd()
    $proc.WaitForExit()
    return [pscustomobject]@{ Code = $proc.ExitCode; Output = ($stdout + $stderrTask.Result).Replace("`0", "") }
}

function Invoke-Streamed([string]$Exe, [string[]]$Arguments) {
    # Runs a program, printing each line as it comes and collecting them; progress lines drive Write-Progress.
    $lines = New-Object System.Collections.Generic.List[string]
    $saved = $ErrorActionPreference
    $ErrorActionPreference = "Continue"
    try {
        & $Exe @Arguments | ForEach-Object {
            $line = [string]$_
            $lines.Add($line)
            if ($line.StartsWith("$Tag step ")) {
                Write-Host $line -ForegroundColor Cyan
                Write-Progress -Activity "Installing wslm in $Distro" -Status $line.Substring($Tag.Length + 1)
            } elseif ($line.StartsWith("$Tag error:") -or $line.StartsWith("$Tag fix:")) {
                Write-Host $line -ForegroundColor Red
            } else {
                Write-Host $line
            }
        }
        $code = $LASTEXITCODE
    } finally {
        $ErrorActionPreference = $saved
    }
    return [pscustomobject]@{ Code = $code; Lines = $lines }
}

function Get-WslDistros([string]$Wsl) {
    $result = Invoke-Captured $Wsl "-l -q" ([System.Text.Encoding]::Unicode) $null
    if ($result.Code -ne 0) { return @() }
    $names = @()
    foreach ($raw in ($result.Output -split "`r?`n")) {
        $name = $raw.Trim()
        # Docker Desktop's internal distros cannot run wslm.
        if ($name -ne "" -and (Test-DistroName $name) -and -not $name.StartsWith("docker-desktop")) { $names += $name }
    }
    return $names
}

function Select-Distro([string[]]$Names) {
    if ($Distro -ne "") {
        if (-not (Test-DistroName $Distro)) {
            Stop-WithError "invalid distro name '$Distro'" "use a name from: wsl -l -q"
        }
        foreach ($name in $Names) { if ($name -eq $Distro) { return $name } }
        Stop-WithError "WSL has no distro named '$Distro' (installed: $($Names -join ', '))" "install it: wsl --install -d $Distro"
    }
    if ($Names.Count -eq 1 -or $Yes) { return $Names[0] }
    Write-Info "WSL distros (the first is WSL's default):"
    for ($i = 0; $i -lt $Names.Count; $i++) { Write-Host ("  {0}) {1}" -f ($i + 1), $Names[$i]) }
    while ($true) {
        $answer = Read-Host "Install wslm into which distro? [1]"
        if ($answer -eq "") { return $Names[0] }
        $number = 0
        if ([int]::TryParse($answer, [ref]$number) -and $number -ge 1 -and $number -le $Names.Count) {
            return $Names[$number - 1]
        }
        Write-Host "Type a number from 1 to $($Names.Count)."
    }
}

function ConvertTo-LinuxPath([string]$WindowsPath) {
    # WSL's automount: C:\x\y -> /mnt/c/x/y
    $full = [System.IO.Path]::GetFullPath($WindowsPath)
    return "/mnt/" + $full.Substring(0, 1).ToLower() + $full.Substring(2).Replace("\", "/")
}

function Read-Record {
    if (Test-Path -LiteralPath $RecordPath) {
        return (Get-Content -LiteralPath $RecordPath -Raw | ConvertFrom-Json)
    }
    return $null
}

function Save-Record([hashtable]$Data) {
    New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
    $Data | ConvertTo-Json | Set-Content -LiteralPath $RecordPath -Encoding UTF8
}

function Get-GuiCommand {
    # The program that runs `wslm ...` on Windows: the packaged app, else the GUI venv's wslm.exe.
    $exe = Join-Path $GuiBundle "wslm-gui.exe"
    if (Test-Path -LiteralPath $exe) { return $exe }
    $exe = Join-Path $GuiVenv "Scripts\wslm.exe"
    if (Test-Path -LiteralPath $exe) { return $exe }
    return $null
}

function Install-InDistro([string]$Wsl, [string]$Name) {
    if (-not (Test-Path -LiteralPath $InstallSh)) {
        Stop-WithError "install.sh is missing (looked in $InstallSh)" "download the whole wslm release, not install.ps1 alone"
    }
    # Copy install.sh into the distro through stdin (no drive mounts involved); LF line ends for bash.
    $text = [System.IO.File]::ReadAllText((Resolve-Path -LiteralPath $InstallSh).Path).Replace("`r`n", "`n")
    $bytes = (New-Object System.Text.UTF8Encoding $false).GetBytes($text)
    $copy = Invoke-Captured $Wsl "-d $Name -- mkdir -p ~/.wslm ; cat >~/.wslm/install.sh" ([System.Text.Encoding]::UTF8) $bytes
    if ($copy.Code -ne 0) {
        Stop-WithError "could not copy install.sh into $Name (exit $($copy.Code)): $($copy.Output.Trim())" "start the distro once (wsl -d $Name) and check it works, then re-run"
    }
    $arguments = @("-d", $Name, "--", "bash", "~/.wslm/install.sh")
    if ($Source -ne "") {
        $arguments += @("--source", $Source)
    } elseif (Test-Path -LiteralPath (Join-Path $Checkout "pyproject.toml")) {
        $arguments += @("--source", (ConvertTo-LinuxPath $Checkout))
    }
    $arguments += @("2>&1")  # quoted: for the Linux shell, so stderr lines arrive in order
    $run = Invoke-Streamed $Wsl $arguments
    if ($run.Code -ne 0) {
        Stop-WithError "install.sh failed in $Name (exit $($run.Code)); its error and fix are above" "fix that, then run install.ps1 again: finished steps are skipped"
    }
    $prefix = ""
    $linkCommand = ""
    foreach ($line in $run.Lines) {
        if ($line.StartsWith("$Tag prefix: ")) { $prefix = $line.Substring("$Tag prefix: ".Length).Trim() }
        if ($line.StartsWith("$Tag needs-system-link: ")) { $linkCommand = $line.Substring("$Tag needs-system-link: ".Length).Trim() }
    }
    if ($linkCommand -ne "") {
        # `wsl -d DISTRO -- wslm` uses a non-login PATH without ~/.local/bin: link wslm into /usr/local/bin as root.
        Write-Info "linking wslm into /usr/local/bin in $Name (as root)"
        $link = Invoke-Streamed $Wsl (@("-d", $Name, "-u", "root", "--") + ($linkCommand -split " " | Where-Object { $_ -ne "" }))
        if ($link.Code -ne 0) {
            Write-Info "warning: could not link /usr/local/bin/wslm; the app may not find wslm. Inside $Name run: $linkCommand (with sudo)"
        }
    }
    return $prefix
}

function Install-Gui {
    $bundleSource = $null
    foreach ($candidate in @((Join-Path $PSScriptRoot "wslm-gui"), (Join-Path $Checkout "dist\wslm-gui"))) {
        if (Test-Path -LiteralPath (Join-Path $candidate "wslm-gui.exe")) { $bundleSource = $candidate; break }
    }
    if ($null -ne $bundleSource) {
        Write-Info "copying the packaged app from $bundleSource"
        if (Test-Path -LiteralPath $GuiBundle) { Remove-Item -LiteralPath $GuiBundle -Recurse -Force }
        Copy-Item -LiteralPath $bundleSource -Destination $GuiBundle -Recurse
        return @{ Kind = "bundle"; Target = (Join-Path $GuiBundle "wslm-gui.exe"); Arguments = "" }
    }
    $py = Get-Command "py.exe" -ErrorAction SilentlyContinue
    if ($null -eq $py) {
        Stop-WithError "the Python launcher (py.exe) is not installed, and there is no packaged app next to this script" "install Python 3.10 or newer: winget install -e --id Python.Python.3.12 (or python.org), then re-run"
    }
    $check = Invoke-Captured $py.Path "-3 -c `"import sys; print(sys.version_info >= (3, 10))`"" ([System.Text.Encoding]::UTF8) $null
    if ($check.Code -ne 0 -or -not $check.Output.Trim().EndsWith("True")) {
        Stop-WithError "py -3 is not Python 3.10 or newer ($($check.Output.Trim()))" "install a newer Python: winget install -e --id Python.Python.3.12, then re-run"
    }
    $venvPython = Join-Path $GuiVenv "Scripts\python.exe"
    if (-not (Test-Path -LiteralPath $venvPython)) {
        Write-Info "creating the app's venv in $GuiVenv"
        & $py.Path -3 -m venv $GuiVenv | Out-Host
        if ($LASTEXITCODE -ne 0) { Stop-WithError "py -3 -m venv failed (exit $LASTEXITCODE)" "repair or reinstall Python, then re-run" }
    }
    if (Test-Path -LiteralPath (Join-Path $Checkout "pyproject.toml")) {
        $requirement = (Resolve-Path -LiteralPath $Checkout).Path + "[gui]"
    } elseif ($Source -match "^wslm(\[[^\]]*\])?(.*)$") {
        $requirement = "wslm[gui]" + $Matches[2]
    } elseif ($Source -ne "" -and (Test-Path -LiteralPath $Source)) {
        $requirement = (Resolve-Path -LiteralPath $Source).Path + "[gui]"
    } else {
        $requirement = "wslm[gui]"
    }
    Write-Info "installing $requirement into the app's venv"
    & $venvPython -m pip install --disable-pip-version-check --no-input $requirement | Out-Host
    if ($LASTEXITCODE -ne 0) { Stop-WithError "pip could not install $requirement (exit $LASTEXITCODE)" "check the network, then re-run" }
    # The app's first-run check offers install.sh for other distros: it looks in <venv>\share\wslm.
    $share = Join-Path $GuiVenv "share\wslm"
    New-Item -ItemType Directory -Force -Path $share | Out-Null
    Copy-Item -LiteralPath $InstallSh -Destination (Join-Path $share "install.sh") -Force
    return @{ Kind = "venv"; Target = (Join-Path $GuiVenv "Scripts\pythonw.exe"); Arguments = "-m wslm gui" }
}

function New-Shortcut([hashtable]$Gui) {
    $shell = New-Object -ComObject WScript.Shell
    $shortcut = $shell.CreateShortcut($ShortcutPath)
    $shortcut.TargetPath = $Gui.Target
    $shortcut.Arguments = $Gui.Arguments
    $shortcut.WorkingDirectory = $InstallDir
    $shortcut.Description = "wslm: local LLMs in WSL"
    $shortcut.Save()
}

function Get-SharedPorts {
    # share.json in wslm's config folder (platformdirs: %LOCALAPPDATA%\wslm) lists the ports wslm shared.
    $configDir = $env:WSLM_CONFIG_DIR
    if ($null -eq $configDir -or $configDir -eq "") { $configDir = Join-Path $env:LOCALAPPDATA "wslm" }
    $path = Join-Path $configDir "share.json"
    $ports = @()
    if (-not (Test-Path -LiteralPath $path)) { return $ports }
    try {
        $data = Get-Content -LiteralPath $path -Raw | ConvertFrom-Json
    } catch {
        Write-Info "warning: $path is not readable JSON; only the firewall fallback runs"
        return $ports
    }
    if ($null -ne $data.PSObject.Properties["rules"]) {
        foreach ($rule in $data.rules) { if ($ports -notcontains [int]$rule.port) { $ports += [int]$rule.port } }
    }
    if ($null -ne $data.PSObject.Properties["shares"]) {
        foreach ($p in $data.shares.PSObject.Properties) { if ($ports -notcontains [int]$p.Name) { $ports += [int]$p.Name } }
    }
    return $ports
}

function Remove-SharingRules {
    $wslmCommand = Get-GuiCommand
    $ports = Get-SharedPorts
    foreach ($port in $ports) {
        if ($null -eq $wslmCommand) { break }
        Write-Info "removing LAN sharing on port $port (wslm share off; Windows may ask for permission)"
        # Start-Process -Wait: the packaged app is a windowed program, which `&` would not wait for.
        $proc = Start-Process -FilePath $wslmCommand -ArgumentList @("share", "off", "--port", [string]$port) -Wait -PassThru -NoNewWindow
        if ($proc.ExitCode -ne 0) { Write-Info "warning: wslm share off --port $port failed (exit $($proc.ExitCode))" }
    }
    # Fallback: firewall rules whose name starts with "wslm" (wslm names every rule so); nothing else.
    $rules = @(Get-NetFirewallRule -ErrorAction SilentlyContinue | Where-Object { ([string]$_.DisplayName).StartsWith("wslm") })
    $hyperv = @()
    if ($null -ne (Get-Command "Get-NetFirewallHyperVRule" -ErrorAction SilentlyContinue)) {
        $hyperv = @(Get-NetFirewallHyperVRule -ErrorAction SilentlyContinue | Where-Object { ([string]$_.Name).StartsWith("wslm") })
    }
    if ($rules.Count -eq 0 -and $hyperv.Count -eq 0) { return }
    $names = @($rules | ForEach-Object { $_.DisplayName }) + @($hyperv | ForEach-Object { $_.Name })
    Write-Info "removing leftover firewall rules: $($names -join ', ')"
    # The elevated copy re-selects by the same rule: a fixed command, no names from outside in it.
    $command = "Get-NetFirewallRule | Where-Object { ([string]`$_.DisplayName).StartsWith('wslm') } | Remove-NetFirewallRule; " +
        "if (Get-Command Get-NetFirewallHyperVRule -ErrorAction SilentlyContinue) { " +
        "Get-NetFirewallHyperVRule | Where-Object { ([string]`$_.Name).StartsWith('wslm') } | Remove-NetFirewallHyperVRule }"
    if (Test-Admin) {
        $rules | Remove-NetFirewallRule
        foreach ($rule in $hyperv) { Remove-NetFirewallHyperVRule -Name $rule.Name }
    } else {
        $encoded = [Convert]::ToBase64String([System.Text.Encoding]::Unicode.GetBytes($command))
        Start-Process -FilePath "powershell.exe" -ArgumentList @("-NoProfile", "-EncodedCommand", $encoded) -Verb RunAs -Wait
    }
}

function Uninstall-Wslm {
    $record = Read-Record
    Write-Step 1 "LAN sharing rules (portproxy, firewall)"
    Remove-SharingRules
    Write-Step 2 "wslm inside WSL"
    $wsl = Get-WslExe
    $name = $Distro
    if ($name -eq "" -and $null -ne $record -and $null -ne $record.PSObject.Properties["distro"]) { $name = [string]$record.distro }
    if ($name -ne "" -and $null -ne $wsl -and (Test-DistroName $name)) {
        $prefix = "~/.wslm"
        if ($null -ne $record -and $null -ne $record.PSObject.Properties["prefix"] -and [string]$record.prefix -ne "") { $prefix = [string]$record.prefix }
        # Root first (the link in /usr/local/bin; only with the recorded absolute prefix: root's ~ is not
        # the user's), then the user's part, which deletes the script copy.
        if ($prefix.StartsWith("/")) {
            Invoke-Streamed $wsl @("-d", $name, "-u", "root", "--", "test", "!", "-f", "$prefix/install.sh", "||",
                "bash", "$prefix/install.sh", "--system-link", "--uninstall", "--prefix", $prefix, "2>&1") | Out-Null
        }
        $run = Invoke-Streamed $wsl @("-d", $name, "--", "test", "!", "-f", "$prefix/install.sh", "||",
            "bash", "$prefix/install.sh", "--uninstall", "--prefix", $prefix, "2>&1")
        if ($run.Code -ne 0) { Write-Info "warning: uninstalling inside $name failed (exit $($run.Code)); see above" }
    } else {
        Write-Info "no distro recorded: skipped (pass -Distro NAME to uninstall wslm inside it)"
    }
    Write-Step 3 "the app and its shortcut"
    if (Test-Path -LiteralPath $ShortcutPath) { Remove-Item -LiteralPath $ShortcutPath -Force; Write-Info "removed $ShortcutPath" }
    foreach ($folder in @($GuiVenv, $GuiBundle)) {
        if (Test-Path -LiteralPath $folder) { Remove-Item -LiteralPath $folder -Recurse -Force; Write-Info "removed $folder" }
    }
    if (Test-Path -LiteralPath $RecordPath) { Remove-Item -LiteralPath $RecordPath -Force }
    if ((Test-Path -LiteralPath $InstallDir) -and @(Get-ChildItem -LiteralPath $InstallDir -Force).Count -eq 0) {
        Remove-Item -LiteralPath $InstallDir -Force
    }
    Write-Progress -Activity "Uninstalling wslm" -Completed
    Write-Info "uninstalled. Kept: your chats, settings and API key in $env:LOCALAPPDATA\wslm, and models inside WSL."
}

function Install-Wslm {
    Write-Step 1 "Windows version"
    $build = [Environment]::OSVersion.Version.Build
    if ($build -lt $MinBuild) {
        Stop-WithError "wslm needs Windows 10 version 2004 (build $MinBuild) or newer; this is build $build" "update Windows (Settings > Windows Update), then re-run"
    }
    Write-Info "Windows build $build"

    Write-Step 2 "WSL"
    $wsl = Get-WslExe
    $wslWorks = $false
    if ($null -ne $wsl) {
        # Older inbox wsl.exe has no --status; a working `wsl -l -q` says the same.
        $status = Invoke-Captured $wsl "--status" ([System.Text.Encoding]::Unicode) $null
        $list = Invoke-Captured $wsl "-l -q" ([System.Text.Encoding]::Unicode) $null
        $wslWorks = ($status.Code -eq 0 -or $list.Code -eq 0)
    }
    if (-not $wslWorks) {
        Write-Info "WSL is not installed (or not enabled)."
        if (-not (Confirm-Choice "Install WSL with Ubuntu now (wsl --install; needs administrator rights and a restart)?")) {
            Stop-WithError "WSL is required" "in an administrator PowerShell run: wsl --install ; restart, then re-run this installer"
        }
        try {
            Start-Process -FilePath "wsl.exe" -ArgumentList @("--install") -Verb RunAs -Wait
        } catch {
            Stop-WithError "could not start wsl --install: $($_.Exception.Message)" "enable WSL in an administrator PowerShell: dism.exe /online /enable-feature /featurename:Microsoft-Windows-Subsystem-Linux /all ; restart, then re-run"
        }
        Write-Info "WSL is being installed. Restart Windows, open Ubuntu once from the Start menu to create your Linux user, then run this installer again."
        exit 0
    }

    Write-Step 3 "WSL distro"
    $names = @(Get-WslDistros $wsl)
    if ($names.Count -eq 0) {
        if (-not (Confirm-Choice "WSL has no Linux distro yet. Install Ubuntu now (wsl --install -d Ubuntu)?")) {
            Stop-WithError "wslm needs a WSL distro" "wsl --install -d Ubuntu ; then re-run this installer"
        }
        & $wsl --install -d Ubuntu | Out-Host
        $names = @(Get-WslDistros $wsl)
        if ($names.Count -eq 0) {
            Stop-WithError "Ubuntu is not ready yet" "open Ubuntu once from the Start menu to finish its set-up (user name, password), then re-run"
        }
    }
    $previous = Read-Record
    if ($Distro -eq "" -and $null -ne $previous -and $null -ne $previous.PSObject.Properties["distro"] -and $names -contains [string]$previous.distro) {
        $script:Distro = [string]$previous.distro  # a re-run keeps the distro of the last install
    }
    $script:Distro = Select-Distro $names
    Write-Info "using WSL distro $Distro"

    Write-Step 4 "wslm inside $Distro (install.sh: Python venv, PyTorch, demo and embedding models; several minutes)"
    $prefix = Install-InDistro $wsl $Distro
    $record = @{ distro = $Distro; prefix = $prefix; gui = "" }
    Save-Record $record

    if ($SkipGui) {
        Write-Info "skipping the app (-SkipGui)"
        return
    }
    Write-Step 5 "the wslm app"
    $gui = Install-Gui
    $record.gui = $gui.Kind
    Save-Record $record

    Write-Step 6 "Start-menu shortcut"
    New-Shortcut $gui
    Write-Info "created $ShortcutPath"
    Write-Progress -Activity "Installing wslm" -Completed
    Write-Info "done. Start wslm from the Start menu; in its first-run window choose 'WSL: $Distro'."
    if (Confirm-Choice "Start wslm now?") {
        if ($gui.Arguments -eq "") {
            Start-Process -FilePath $gui.Target
        } else {
            Start-Process -FilePath $gui.Target -ArgumentList $gui.Arguments
        }
    }
}

if ($Uninstall) {
    Uninstall-Wslm
} else {
    Install-Wslm
}
